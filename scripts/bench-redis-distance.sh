#!/usr/bin/env bash
# A Sluice node deciding locally against the same daemon asking Redis on every request
# (`coordination: redis`, `--redis-mode exact`: envoyproxy/ratelimit's design), with Redis
# at an emulated network distance: `sluice delay-proxy` between the daemon and
# redis-server adds a fixed one-way delay to each direction (a user-space proxy on loopback;
# for machines without a second host or `netem`).
#
#   bash scripts/bench-redis-distance.sh
#   CONCS="1 16 256" DELAYS="direct 0 100us 250us 500us" DUR=10s bash scripts/bench-redis-distance.sh
#   OPEN_RATE=2000 OPEN_SECS=10 ROUNDS=2 bash scripts/bench-redis-distance.sh
#   BIN=path/to/other/sluice bash scripts/bench-redis-distance.sh   # another build
#   SERVE_ARGS="--grpc-http2 h2" bash scripts/bench-redis-distance.sh  # flags for both daemons
#
# Per delay ("direct": no proxy; "0": through the proxy without delay): per client
# concurrency in CONCS, `sluice bench --grpc LOCAL --vs-grpc REDIS` closed loop for DUR each
# (calls/s, p99, the ratios); then the same open loop at OPEN_RATE calls/s, at most the last
# of CONCS in flight (service time, send to answer: p50 and p99). Both daemons pinned to
# SERVER_CPUS; the load generator, redis-server and the proxy to LOAD_CPUS (set both to
# "0,1" to not pin). Same rule on both sides, far above the load (every call admitted),
# KEYS keys round robin; the Redis daemon waits up to 5 s for Redis (so it never falls back
# to a local decision: checked after each run).
# Also printed: the PING round trip through the proxy (a Python client: its own overhead
# included), and CPU per call of each daemon and of redis-server + proxy (from /proc).
set -euo pipefail
cd "$(dirname "$0")/.."

CONCS="${CONCS:-1 16 256}"
DELAYS="${DELAYS:-direct 0 100us 250us 500us}"
DUR="${DUR:-10s}"
CONNS="${CONNS:-2}"
KEYS="${KEYS:-1000}"
OPEN_RATE="${OPEN_RATE:-2000}"
OPEN_SECS="${OPEN_SECS:-10}"
ROUNDS="${ROUNDS:-1}"
SERVE_ARGS="${SERVE_ARGS:-}"
SERVER_CPUS="${SERVER_CPUS:-0}"
LOAD_CPUS="${LOAD_CPUS:-1}"

if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
fi

# BIN: another build of `sluice` for both daemons and the generator (not built here).
if [ -z "${BIN:-}" ]; then
  echo "== building (release)"
  cargo build --release --locked -p sluice
  BIN="${CARGO_TARGET_DIR:-target}/release/sluice"
fi

dir="$(mktemp -d)"
# The processes started here (the per-delay ones while they run).
pids=()
redis_node=""
proxy=""
cleanup() {
  for p in "${pids[@]}" $redis_node $proxy; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}" $redis_node $proxy; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

REDIS_PORT=16479
PROXY_PORT=16480
LOCAL_GRPC=18681; LOCAL_HTTP=18680
REDIS_GRPC=18691; REDIS_HTTP=18690

for c in local redis; do
  mkdir -p "$dir/$c"
  cat >"$dir/$c/bench.yaml" <<EOF
domain: bench
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 1000000000, algorithm: fixed-window, coordination: $c }
EOF
done

wait_ready() { # pid, http port, log
  for _ in $(seq 100); do
    if curl -sf "http://127.0.0.1:$2/readyz" >/dev/null 2>&1 && kill -0 "$1" 2>/dev/null; then
      return
    fi
    sleep 0.1
  done
  echo "sluice serve did not become ready:"; cat "$3"; exit 1
}
# utime + stime of processes, in clock ticks.
ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }

taskset -c "$LOAD_CPUS" redis-server --port "$REDIS_PORT" --save '' --appendonly no \
  >"$dir/redis.log" 2>&1 &
redis=$!; pids+=("$redis")
taskset -c "$SERVER_CPUS" "$BIN" serve --config "$dir/local" --grpc-addr "127.0.0.1:$LOCAL_GRPC" \
  --http-addr "127.0.0.1:$LOCAL_HTTP" --watch off $SERVE_ARGS >"$dir/local.log" 2>&1 &
local_node=$!; pids+=("$local_node")
wait_ready "$local_node" "$LOCAL_HTTP" "$dir/local.log"

# PING round trips on one connection: p50 and p99 in µs.
ping_rtt() { # port
  python3 - "$1" <<'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
t = []
for i in range(1100):
    t0 = time.perf_counter()
    s.sendall(b"PING\r\n")
    buf = b""
    while not buf.endswith(b"\r\n"):
        buf += s.recv(64)
    if i >= 100:
        t.append((time.perf_counter() - t0) * 1e6)
t.sort()
print(f"{t[len(t) // 2]:.0f}/{t[len(t) * 99 // 100]:.0f}")
EOF
}

summary="$dir/summary.txt"
echo "== daemons on CPU $SERVER_CPUS; load generator, redis-server and proxy on CPU $LOAD_CPUS;" \
  "closed loop $DUR per side, $CONNS connections, $KEYS keys; open loop $OPEN_RATE/s for ${OPEN_SECS}s;" \
  "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
  for delay in $DELAYS; do
    proxy=""
    redis_url="redis://127.0.0.1:$REDIS_PORT/"
    helpers=("$redis")
    if [ "$delay" != direct ]; then
      taskset -c "$LOAD_CPUS" "$BIN" delay-proxy --listen "127.0.0.1:$PROXY_PORT" \
        --upstream "127.0.0.1:$REDIS_PORT" --delay "$delay" >"$dir/proxy.log" 2>&1 &
      proxy=$!; helpers+=("$proxy")
      redis_url="redis://127.0.0.1:$PROXY_PORT/"
      sleep 0.3
    fi
    rtt="$(ping_rtt "$([ -n "$proxy" ] && echo "$PROXY_PORT" || echo "$REDIS_PORT")")"
    taskset -c "$SERVER_CPUS" "$BIN" serve --config "$dir/redis" --grpc-addr "127.0.0.1:$REDIS_GRPC" \
      --http-addr "127.0.0.1:$REDIS_HTTP" --watch off --redis-url "$redis_url" --redis-mode exact \
      --redis-timeout 5s $SERVE_ARGS >"$dir/redis-node.log" 2>&1 &
    redis_node=$!
    wait_ready "$redis_node" "$REDIS_HTTP" "$dir/redis-node.log"
    # Closed loop at each concurrency, then one open loop (at most the last of CONCS in flight).
    runs=()
    for conc in $CONCS; do runs+=("closed:$conc"); done
    runs+=("open:${CONCS##* }")
    for run in "${runs[@]}"; do
      mode="${run%%:*}"; conc="${run##*:}"
      if [ "$mode" = closed ]; then load=(--duration "$DUR"); else load=(--rate "$OPEN_RATE" --duration "${OPEN_SECS}s"); fi
      a0="$(ticks "$local_node")"; b0="$(ticks "$redis_node")"; h0="$(ticks "${helpers[@]}")"
      taskset -c "$LOAD_CPUS" "$BIN" bench --grpc "127.0.0.1:$LOCAL_GRPC" --vs-grpc "127.0.0.1:$REDIS_GRPC" \
        "${load[@]}" --keys "$KEYS" --concurrency "$conc" --connections "$CONNS" --domain bench \
        --descriptor 'k=key-{i}' --json >"$dir/out.json" 2>"$dir/bench.err" || {
        echo "bench failed:"; tail -n 5 "$dir/bench.err"; exit 1; }
      a1="$(ticks "$local_node")"; b1="$(ticks "$redis_node")"; h1="$(ticks "${helpers[@]}")"
      local_decisions="$(curl -sf "http://127.0.0.1:$REDIS_HTTP/metrics" | awk '/^sluice_redis_decisions_local /{print $2}')"
      python3 - "$delay" "$conc" "$mode" "$rtt" "$((a1 - a0))" "$((b1 - b0))" "$((h1 - h0))" \
        "$(getconf CLK_TCK)" "${local_decisions:-?}" "$dir/out.json" <<'EOF' | tee -a "$summary"
import json, sys
delay, conc, mode, rtt, ta, tb, th, hz, fallback, out = sys.argv[1:]
r = json.load(open(out)); s, b, q = r["subject"], r["baseline"], r["ratios"]
hz = int(hz)
def calls(x): return x["ok"] + x["over_limit"] + x["errors"]
def us(t, x): return int(t) / hz / max(calls(x), 1) * 1e6
errors = s["errors"] + b["errors"]
note = f"  ERRORS {errors}" if errors else ""
if fallback != "0":
    note += f"  FALLBACK DECISIONS {fallback}"
f = lambda v: "—" if v is None else f"{v:.2f}"
cpu = f"{us(ta, s):.1f} / {us(tb, b):.1f} / {us(th, b):.1f}"
if mode == "closed":
    ls, lb = s["latency_us"], b["latency_us"]
    print(f"| {delay} | {rtt} | {conc} | closed | {s['throughput']:,.0f}/s | {b['throughput']:,.0f}/s | "
          f"**{f(q['throughput'])}×** | {ls['p99']/1000:.2f} | {lb['p99']/1000:.2f} | **{f(q['p99'])}** | "
          f"{cpu} |{note}")
else:
    ss, sb = s["service_time_us"], b["service_time_us"]
    print(f"| {delay} | {rtt} | ≤ {conc} | open {s['target_rate']:.0f}/s | p50 {ss['p50']/1000:.2f} ms | "
          f"p50 {sb['p50']/1000:.2f} ms | {ss['p50']/sb['p50']:.2f} | {ss['p99']/1000:.2f} | {sb['p99']/1000:.2f} | "
          f"**{ss['p99']/sb['p99']:.2f}** | {cpu} |{note}")
EOF
    done
    kill "$redis_node"; wait "$redis_node" 2>/dev/null || true; redis_node=""
    if [ -n "$proxy" ]; then kill "$proxy"; wait "$proxy" 2>/dev/null || true; proxy=""; fi
  done
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "closed rows: calls/s and p99 of Sluice (local) and of Redis per request, ratios Sluice ÷ Redis;"
echo "open rows: service time (send to answer) p50 and p99"
echo "| delay each way | PING RTT p50/p99 µs | in flight | load | Sluice | Redis | ratio | Sluice p99 ms | Redis p99 ms | p99 ratio | CPU µs/call: Sluice / Redis node / redis+proxy |"
echo "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"
cat "$summary"
