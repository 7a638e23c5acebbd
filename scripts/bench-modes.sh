#!/usr/bin/env bash
# Side by side, same load: a rule of 1,000/s decided `local`ly, by the `cluster`
# (sluice-coord), by Redis (`exact`, `batched`) and by a `token-server`. Two `sluice serve`
# nodes on 127.0.0.1, `sluice bench` round robin over both (gRPC), one key; prints one
# Markdown row per mode: decisions/s, p50/p99 latency, admitted, errors, admitted/(L·t).
# Needs redis-server on PATH (scripts/test-all.sh installs it).
#
#   cargo build --release -p sluice && scripts/bench-modes.sh
#   BIN=target/release/sluice DUR=10s CONC=16 scripts/bench-modes.sh
set -u
BIN=${BIN:-target/release/sluice}
DUR=${DUR:-10s}
CONC=${CONC:-16}
LIMIT=1000
W=$(mktemp -d)
export SLUICE_PEER_KEY=${SLUICE_PEER_KEY:-0123456789abcdef0123456789abcdef}
export RUST_LOG=${RUST_LOG:-warn}
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
}
trap 'stop; rm -rf "$W"' EXIT
conf() { # coordination [algorithm]
  mkdir -p "$W/conf-$1"
  cat > "$W/conf-$1/bench.yaml" <<Y
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: $LIMIT, coordination: $1, algorithm: ${2:-fixed-window} }
Y
}
node() { # i extra-args...
  local i=$1; shift
  "$BIN" serve --grpc-addr 127.0.0.1:$((18081+10*i)) --http-addr 127.0.0.1:$((18080+10*i)) \
     --peer-addr 127.0.0.1:$((18082+10*i)) --watch off "$@" > "$W/node$i.log" 2>&1 &
  pids+=($!)
}
bench() { # label
  sleep "${WARM:-3}"
  "$BIN" bench --grpc 127.0.0.1:18081,127.0.0.1:18091 --duration "$DUR" --concurrency "$CONC" \
     --domain bench --descriptor user=u --json 2>/dev/null > "$W/$1.json"
  python3 - "$W/$1.json" "$1" "$LIMIT" <<'P'
import json, sys
r = json.load(open(sys.argv[1]))
L = int(sys.argv[3]); lat = r.get("latency_us") or {}
acc = r["ok"] / (L * r["elapsed_s"])
print(f"| {sys.argv[2]} | {r['throughput']:.0f} | {lat.get('p50', 0):.0f} | {lat.get('p99', 0):.0f} | {r['ok']} | {r['errors']} | {acc:.3f} |")
P
  stop
}
echo "| mode | decisions/s | p50 µs | p99 µs | admitted | errors | admitted/(L·t) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
conf local
node 0 --config "$W/conf-local"; node 1 --config "$W/conf-local"; bench local
conf cluster
node 0 --config "$W/conf-cluster" --node-id 0 --peers 1=127.0.0.1:18092 --cycle 50ms
node 1 --config "$W/conf-cluster" --node-id 1 --peers 0=127.0.0.1:18082 --cycle 50ms
bench cluster
# The bucket algorithms meter a rate, so a share that moves is usable at once (`shares`
# module documentation): the cluster's natural algorithm.
conf cluster gcra
node 0 --config "$W/conf-cluster" --node-id 0 --peers 1=127.0.0.1:18092 --cycle 50ms
node 1 --config "$W/conf-cluster" --node-id 1 --peers 0=127.0.0.1:18082 --cycle 50ms
bench cluster-gcra
redis-server --port 16399 --save '' --appendonly no > "$W/redis.log" 2>&1 & RP=$!
sleep 0.5
conf redis
node 0 --config "$W/conf-redis" --redis-url redis://127.0.0.1:16399/ --redis-mode exact
node 1 --config "$W/conf-redis" --redis-url redis://127.0.0.1:16399/ --redis-mode exact
bench redis-exact
redis-cli -p 16399 flushall > /dev/null
node 0 --config "$W/conf-redis" --redis-url redis://127.0.0.1:16399/ --redis-mode batched
node 1 --config "$W/conf-redis" --redis-url redis://127.0.0.1:16399/ --redis-mode batched
bench redis-batched
kill "$RP"; wait "$RP" 2>/dev/null
conf token-server
node 0 --config "$W/conf-token-server" --token-servers 0=127.0.0.1:18083 --token-server-id 0 --token-nodes 2
node 1 --config "$W/conf-token-server" --token-servers 0=127.0.0.1:18083 --token-nodes 2
bench token-server
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
