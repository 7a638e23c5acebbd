#!/usr/bin/env bash
# The chaos suite of the real stack: `sluice serve` processes on 127.0.0.1, a client that
# counts what they admit in sliding 1 s windows, and kill -9 / restart (with and without a
# state file), crashes after restarts, SIGSTOP/SIGCONT around the lease, rolling restarts by
# SIGTERM, a rolling upgrade onto the next wire version (and back, in the long version), key
# floods, a flood at one node; then the token server's failures.
# Each scenario prints one line: `chaos NAME: field=value ...` (overshoot as the largest 1 s
# window against L + burst = 1,100, recovery times, RSS, UDP drops, incarnations).
#
#   bash scripts/chaos.sh          # the long version: 1,000,000-key flood (about 12 minutes)
#   bash scripts/chaos.sh --short  # the version the test command runs (about two minutes)
#   CHAOS_SERVE_ARGS="--grpc-http2 h2" bash scripts/chaos.sh   # extra flags for every daemon
#
# Loopback only; every scenario is bounded in time and stops its processes itself.
set -euo pipefail
cd "$(dirname "$0")/.."

need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "== installing $2"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2"
  fi
}
# kill(1) signals the daemons (procps); iptables cuts their links on loopback; faketime
# skews a node's clock; the scenarios read /proc for RSS and UDP drops.
need kill procps
need iptables iptables
need faketime faketime

# The long version runs every order of every scenario.
if [ "${1:-}" != "--short" ]; then
  export CHAOS_LONG=1
fi
log="$(mktemp)"
# Each scenario's line as it ends; the whole output stays in the log.
set +e
# The cluster's scenarios, then the token server's (a frozen primary, a cut between servers,
# replays: crates/sluice/tests/token_chaos.rs).
cargo test --release --locked --no-fail-fast -p sluice --test chaos --test token_chaos -- --nocapture \
  --test-threads 1 2>&1 \
  | tee "$log" \
  | grep --line-buffered -E '^chaos |^test |panicked|^  left|^  right|test result'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "chaos: a scenario failed; the whole output is in $log"
  exit "$status"
fi
rm -f "$log"
