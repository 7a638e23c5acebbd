#!/usr/bin/env bash
# Every check the project has, in the order that fails fastest.
# Runs on a fresh machine with only the Rust toolchain: it installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Redis backend's tests run against a real redis-server (and redis-cli for the cluster).
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "== installing redis-server and redis-tools"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools
fi

echo "== rustfmt"
cargo fmt --all -- --check

echo "== clippy (warnings are errors)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

echo "== tests (unit, integration, property, concurrency models, doc examples)"
cargo test --workspace --all-features --locked
