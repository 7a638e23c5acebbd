#!/usr/bin/env bash
# The daemon's speed over gRPC, measured from outside: one `sluice serve` pinned to CPU 0, the
# load generator pinned to CPU 1, one hot key always admitted (a local rule far above the
# load), `ShouldRateLimit` as HTTP/2 POSTs of a pre-encoded request.
#
#   bash scripts/bench-daemon.sh              # 200,000 calls per generator, 4 connections x 64 streams
#   CALLS=500000 bash scripts/bench-daemon.sh
#
# Prints, for h2load (Debian's nghttp2-client, an independent generator) and `sluice bench`
# (ours), each against a fresh server: calls/s, the server's CPU per call (utime + stime from
# /proc over the run / calls), the generator's CPU per call, and latency percentiles. Then one
# more h2load run under `strace -c` for the server's write syscalls per call (strace slows the
# server, so that run is not timed).
set -euo pipefail
cd "$(dirname "$0")/.."

CALLS="${CALLS:-200000}"
CONNS="${CONNS:-4}"
STREAMS="${STREAMS:-64}"

if ! command -v h2load >/dev/null 2>&1; then
  echo "== installing nghttp2-client (h2load)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client
fi
if [ ! -x /usr/bin/time ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time
fi
command -v strace >/dev/null 2>&1 || echo "(strace missing: no syscall count)"

echo "== building (release)"
cargo build --release --locked -p sluice
BIN=target/release/sluice

dir="$(mktemp -d)"
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

cat >"$dir/limits.yaml" <<'EOF'
domain: bench
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
EOF
# The gRPC frame of RateLimitRequest{domain: "bench", descriptors: [{entries: [{k: hot}]}]}:
# a 0 byte (not compressed), the length (4 bytes, big-endian), the protobuf.
python3 - "$dir/body.bin" <<'EOF'
import struct, sys
def field(num, payload):
    return bytes([num << 3 | 2, len(payload)]) + payload
entry = field(1, b"k") + field(2, b"hot")
descriptor = field(1, entry)
request = field(1, b"bench") + field(2, descriptor)
open(sys.argv[1], "wb").write(b"\0" + struct.pack(">I", len(request)) + request)
EOF

PORT=18561
URL="http://127.0.0.1:$PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

start_server() {
  taskset -c 0 "$BIN" serve --config "$dir/limits.yaml" --grpc-addr "127.0.0.1:$PORT" \
    --http-addr 127.0.0.1:18562 --watch off 2>"$dir/server.log" &
  server=$!
  for _ in $(seq 100); do
    if curl -sf http://127.0.0.1:18562/readyz >/dev/null 2>&1; then return; fi
    sleep 0.1
  done
  echo "sluice serve did not become ready:"; cat "$dir/server.log"; exit 1
}
stop_server() { kill "$server"; wait "$server" 2>/dev/null || true; server=""; }
# utime + stime of a process, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"

run() { # name, command...
  local name="$1"; shift
  start_server
  local before; before="$(ticks "$server")"
  local t0; t0="$(date +%s.%N)"
  /usr/bin/time -f "%U %S" -o "$dir/client.time" "$@" >"$dir/$name.out" 2>&1
  local t1; t1="$(date +%s.%N)"
  local after; after="$(ticks "$server")"
  stop_server
  read -r cu cs <"$dir/client.time"
  python3 - "$name" "$CALLS" "$before" "$after" "$hz" "$t0" "$t1" "$cu" "$cs" "$dir/$name.out" <<'EOF'
import re, sys
name, calls, before, after, hz, t0, t1, cu, cs, out = sys.argv[1:]
calls = int(calls); secs = float(t1) - float(t0)
server_us = (int(after) - int(before)) / int(hz) / calls * 1e6
client_us = (float(cu) + float(cs)) / calls * 1e6
text = open(out).read()
lat = ""
m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", text)
if m:
    lat = f"h2load request time min {m.group(1)} max {m.group(2)} mean {m.group(3)}"
# `sluice bench`: a header row (mean p50 p90 p99 p99.9 max) over "latency µs" values.
head = re.search(r"^\s+mean\s+p50.*$", text, re.M)
row = re.search(r"^\s+latency µs(.*)$", text, re.M)
if head and row:
    lat = "latency µs " + ", ".join(
        f"{k} {v}" for k, v in zip(head.group(0).split(), row.group(1).split()))
print(f"{name}: {calls / secs:,.0f} calls/s; server CPU {server_us:.2f} us/call; "
      f"generator CPU {client_us:.2f} us/call; {lat.strip()}")
EOF
}

echo "== h2load: $CALLS calls, $CONNS connections x $STREAMS streams"
run h2load taskset -c 1 h2load -n "$CALLS" -c "$CONNS" -m "$STREAMS" -d "$dir/body.bin" \
  -H 'content-type: application/grpc' -H 'te: trailers' "$URL"
echo "== sluice bench: $CALLS calls, $CONNS connections, $((CONNS * STREAMS)) in flight"
run sluice-bench taskset -c 1 "$BIN" bench --grpc "127.0.0.1:$PORT" --requests "$CALLS" \
  --concurrency "$((CONNS * STREAMS))" --connections "$CONNS" --domain bench --descriptor k=hot

if command -v strace >/dev/null 2>&1; then
  echo "== write syscalls per call (h2load under strace -c; not timed)"
  start_server
  strace -c -f -e trace=write,writev,sendto,sendmsg -p "$server" -o "$dir/strace.txt" &
  tracer=$!
  sleep 0.5
  taskset -c 1 h2load -n "$CALLS" -c "$CONNS" -m "$STREAMS" -d "$dir/body.bin" \
    -H 'content-type: application/grpc' -H 'te: trailers' "$URL" >/dev/null 2>&1
  kill -INT "$tracer"; wait "$tracer" 2>/dev/null || true
  stop_server
  writes="$(awk '/total/ {print $4}' "$dir/strace.txt")"
  python3 -c "import sys; print(f'server write syscalls per call: {int(sys.argv[1]) / int(sys.argv[2]):.3f}')" \
    "${writes:-0}" "$CALLS"
fi
