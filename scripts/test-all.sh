#!/usr/bin/env bash
# Every check the project has, in the order that fails fastest.
# Runs on a fresh machine with only the Rust toolchain: it installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Redis backend's tests run against a real redis-server (and redis-cli for the cluster);
# the chaos suite (crates/sluice/tests/chaos) cuts links between real daemons with iptables
# on loopback, signals them with kill (procps) and skews a node's clock with faketime.
# scripts/test-image.sh, last, installs podman, runc and debootstrap for the image's test.
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v redis-cli >/dev/null 2>&1 || missing="$missing redis-tools"
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
command -v kill >/dev/null 2>&1 || missing="$missing procps"
command -v faketime >/dev/null 2>&1 || missing="$missing faketime"
if [ -n "$missing" ]; then
  echo "== installing$missing"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # shellcheck disable=SC2086 # one word per package
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi

# A fresh clone gains nothing from incremental compilation, and its caches cost gigabytes
# of disk on a machine that may have little.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

echo "== rustfmt"
cargo fmt --all -- --check

echo "== clippy (warnings are errors)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

echo "== tests (unit, integration, property, concurrency models, doc examples)"
cargo test --workspace --all-features --locked

echo "== the container image: deploy/Dockerfile built and run as the StatefulSet runs it"
bash scripts/test-image.sh
