#!/usr/bin/env bash
# Every check the project has, in the order that fails fastest.
# Runs on a fresh machine with only the Rust toolchain: it installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rustfmt"
cargo fmt --all -- --check

echo "== clippy (warnings are errors)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

echo "== tests (unit, integration, property, concurrency models, doc examples)"
cargo test --workspace --all-features --locked
