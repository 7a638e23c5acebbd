#!/usr/bin/env bash
# The daemon's speed over gRPC and HTTP, measured from outside: one `sluice serve` pinned to
# SERVER_CPUS, the load generator pinned to LOAD_CPUS, one hot key always admitted (a local
# rule far above the load), `ShouldRateLimit` as HTTP/2 POSTs of a pre-encoded request.
#
#   bash scripts/bench-daemon.sh                    # 200,000 calls per run, 4 connections x 64 streams
#   CALLS=500000 ROUNDS=3 bash scripts/bench-daemon.sh
#   BASE_BIN=/path/to/older/sluice bash scripts/bench-daemon.sh   # A/B against another build
#   WORKERS=2 SERVER_CPUS=0,1 LOAD_CPUS=0,1 bash scripts/bench-daemon.sh
#   TESTS="h2load bench open keys" ROUNDS=2 bash scripts/bench-daemon.sh   # pick the tests
#   TESTS="h2load floor" ROUNDS=3 bash scripts/bench-daemon.sh   # against the HTTP/2 floor
#   STACKS="h2 own" bash scripts/bench-daemon.sh    # this build with each `--grpc-http2`
#
# For every server binary (this build, and BASE_BIN if given, alternating round by round so
# that other work on the machine hits both alike), each against a fresh server:
# - h2load (Debian's nghttp2-client, an independent generator), closed loop: calls/s, the
#   server's CPU per call (utime + stime from /proc over the run / calls), h2load's CPU per
#   call, its mean request time;
# - `sluice bench` (ours), the same load: the same figures and its HDR percentiles;
# - `sluice bench` open loop at RATE calls/s for OPEN_SECS: p50 / p99 from the intended send
#   times (no coordinated omission) and the server's CPU per call;
# - `sluice bench` with KEYS keys (`k=u{i}`: every call a key of its own in turn, each key's
#   request encoded once), closed loop, the same load otherwise (only when TESTS has `keys`);
# - h2load --h1 on `GET /v1/check/bench?k=hot` (HTTP/1.1, pipelined): calls/s and CPU per call;
# - the server's write syscalls per call, from one more h2load run under `strace -c -f`
#   (strace slows the server, so that run is not timed);
# - h2load against the example `http2_floor` instead of `sluice serve` (only when TESTS has
#   `floor`): the same engine and call, without an HTTP/2 library's machinery
#   (crates/sluice-loadgen/examples/http2_floor.rs says what it leaves out). A floor for
#   what the daemon's HTTP/2 costs, to read against the h2load line of the same round.
set -euo pipefail
cd "$(dirname "$0")/.."

CALLS="${CALLS:-200000}"
CONNS="${CONNS:-4}"
STREAMS="${STREAMS:-64}"
RATE="${RATE:-30000}"
OPEN_SECS="${OPEN_SECS:-10}"
KEYS="${KEYS:-10000}"
ROUNDS="${ROUNDS:-1}"
SERVER_CPUS="${SERVER_CPUS:-0}"
LOAD_CPUS="${LOAD_CPUS:-1}"
# `--workers N` for `sluice serve` (gRPC worker threads); empty: the binary's default. Not
# given to BASE_BIN, which may predate the flag.
WORKERS="${WORKERS:-}"
BASE_BIN="${BASE_BIN:-}"
# `--grpc-http2` values to run this build with, each its own line per round (labelled by
# it); empty: the binary's default, labelled `new`.
STACKS="${STACKS:-}"
TESTS="${TESTS:-h2load bench open http writes}"

need() { # command, Debian package
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "== installing $2"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2"
  fi
}
need h2load nghttp2-client
[ -x /usr/bin/time ] || need /usr/bin/time time
command -v strace >/dev/null 2>&1 || echo "(strace missing: no syscall count)"

echo "== building (release)"
cargo build --release --locked -p sluice
BIN="${CARGO_TARGET_DIR:-target}/release/sluice"
FLOOR="${CARGO_TARGET_DIR:-target}/release/examples/http2_floor"
case " $TESTS " in
  *" floor "*) cargo build --release --locked -p sluice-loadgen --example http2_floor ;;
esac

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
HTTP_PORT=18562
URL="http://127.0.0.1:$PORT/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
CHECK_URL="http://127.0.0.1:$HTTP_PORT/v1/check/bench?k=hot"

start_server() { # binary, extra flags...
  local bin="$1"; shift
  taskset -c "$SERVER_CPUS" "$bin" serve --config "$dir/limits.yaml" --grpc-addr "127.0.0.1:$PORT" \
    --http-addr "127.0.0.1:$HTTP_PORT" --watch off "$@" 2>"$dir/server.log" &
  server=$!
  for _ in $(seq 100); do
    # (Ready, and still running: not another process on the port.)
    if curl -sf "http://127.0.0.1:$HTTP_PORT/readyz" >/dev/null 2>&1 && kill -0 "$server" 2>/dev/null; then
      return
    fi
    sleep 0.1
  done
  echo "sluice serve did not become ready:"; cat "$dir/server.log"; exit 1
}
stop_server() { kill "$server"; wait "$server" 2>/dev/null || true; server=""; }
# utime + stime of a process, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"

run() { # label, test, calls, command... (the server is running)
  local label="$1" test="$2" calls="$3"; shift 3
  local before; before="$(ticks "$server")"
  local t0; t0="$(date +%s.%N)"
  /usr/bin/time -f "%U %S" -o "$dir/client.time" "$@" >"$dir/out" 2>"$dir/err" || {
    echo "$label $test: the generator failed:"; tail -n 5 "$dir/err" "$dir/out"; return 0; }
  local t1; t1="$(date +%s.%N)"
  local after; after="$(ticks "$server")"
  read -r cu cs <"$dir/client.time"
  python3 - "$label" "$test" "$calls" "$before" "$after" "$hz" "$t0" "$t1" "$cu" "$cs" "$dir/out" <<'EOF'
import json, re, sys
label, test, calls, before, after, hz, t0, t1, cu, cs, out = sys.argv[1:]
text = open(out).read()
calls = int(calls); secs = float(t1) - float(t0); rate = calls / secs; lat = ""
m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", text)
if m:
    lat = f"request time mean {m.group(3)} max {m.group(2)}"
m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", text)
if m and int(m.group(2)) != calls:
    lat += f" ({calls - int(m.group(2))} FAILED)"
if text.lstrip().startswith("{"):
    r = json.loads(text)
    calls = r["ok"] + r["over_limit"] + r["errors"]
    rate = r["throughput"] if r["mode"] == "closed_loop" else calls / secs
    l = r["latency_us"] or {}
    lat = "latency µs " + ", ".join(f"{k} {l.get(k, 0):.0f}" for k in ("p50", "p90", "p99", "p99_9", "max"))
    if r["errors"]:
        lat += f" ({r['errors']} errors)"
server_us = (int(after) - int(before)) / int(hz) / calls * 1e6
client_us = (float(cu) + float(cs)) / calls * 1e6
print(f"{label:>5} {test:<12} {rate:>9,.0f} calls/s  server {server_us:5.2f} µs/call  "
      f"generator {client_us:5.2f} µs/call  {lat}")
EOF
}

# The h2load command line for gRPC calls (an array: /usr/bin/time cannot run a shell function).
H2LOAD_GRPC=(taskset -c "$LOAD_CPUS" h2load -n "$CALLS" -c "$CONNS" -m "$STREAMS"
  -d "$dir/body.bin" -H 'content-type: application/grpc' -H 'te: trailers' "$URL")

one_server() { # label, binary, extra server flags...
  local label="$1" bin="$2"; shift 2
  for test in $TESTS; do
    case "$test" in
      h2load)
        start_server "$bin" "$@"
        run "$label" h2load "$CALLS" "${H2LOAD_GRPC[@]}"
        stop_server ;;
      bench)
        start_server "$bin" "$@"
        run "$label" "sluice-bench" "$CALLS" taskset -c "$LOAD_CPUS" "$BIN" bench \
          --grpc "127.0.0.1:$PORT" --requests "$CALLS" --concurrency "$((CONNS * STREAMS))" \
          --connections "$CONNS" --domain bench --descriptor k=hot --json
        stop_server ;;
      open)
        start_server "$bin" "$@"
        run "$label" "open-$RATE" "$((RATE * OPEN_SECS))" taskset -c "$LOAD_CPUS" "$BIN" bench \
          --grpc "127.0.0.1:$PORT" --rate "$RATE" --duration "${OPEN_SECS}s" \
          --concurrency "$((CONNS * STREAMS))" --connections "$CONNS" --domain bench \
          --descriptor k=hot --json
        stop_server ;;
      keys)
        start_server "$bin" "$@"
        run "$label" "keys-$KEYS" "$CALLS" taskset -c "$LOAD_CPUS" "$BIN" bench \
          --grpc "127.0.0.1:$PORT" --requests "$CALLS" --concurrency "$((CONNS * STREAMS))" \
          --connections "$CONNS" --domain bench --descriptor 'k=u{i}' --keys "$KEYS" --json
        stop_server ;;
      http)
        start_server "$bin" "$@"
        run "$label" "http-check" "$CALLS" taskset -c "$LOAD_CPUS" h2load --h1 -n "$CALLS" \
          -c "$CONNS" -m "$STREAMS" "$CHECK_URL"
        stop_server ;;
      floor)
        # Only this build's round: the floor does not depend on the server binary.
        [ "$label" = new ] || [ "$label" = "${STACKS%% *}" ] || continue
        taskset -c "$SERVER_CPUS" "$FLOOR" "127.0.0.1:$PORT" "$dir/limits.yaml" 2>"$dir/server.log" &
        server=$!
        for _ in $(seq 50); do
          if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then break; fi
          sleep 0.1
        done
        run floor h2load "$CALLS" "${H2LOAD_GRPC[@]}"
        stop_server ;;
      writes)
        command -v strace >/dev/null 2>&1 || continue
        start_server "$bin" "$@"
        strace -c -f -e trace=write,writev,sendto,sendmsg -p "$server" -o "$dir/strace.txt" &
        local tracer=$!
        sleep 0.5
        "${H2LOAD_GRPC[@]}" >/dev/null 2>&1 || true
        kill -INT "$tracer"; wait "$tracer" 2>/dev/null || true
        stop_server
        local writes; writes="$(awk '/total/ {print $4}' "$dir/strace.txt")"
        python3 -c "import sys; print(f'{sys.argv[1]:>5} write syscalls per gRPC call: {int(sys.argv[2]) / int(sys.argv[3]):.3f}')" \
          "$label" "${writes:-0}" "$CALLS" ;;
    esac
  done
}

echo "== server on CPU $SERVER_CPUS, generators on CPU $LOAD_CPUS; $CALLS calls per closed-loop run," \
  "$CONNS connections x $STREAMS streams; open loop $RATE calls/s for ${OPEN_SECS}s"
for round in $(seq "$ROUNDS"); do
  echo "== round $round"
  if [ -n "$STACKS" ]; then
    for stack in $STACKS; do
      one_server "$stack" "$BIN" ${WORKERS:+--workers "$WORKERS"} --grpc-http2 "$stack"
    done
  else
    one_server new "$BIN" ${WORKERS:+--workers "$WORKERS"}
  fi
  if [ -n "$BASE_BIN" ]; then one_server base "$BASE_BIN"; fi
done
