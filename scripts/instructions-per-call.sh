#!/usr/bin/env bash
# The server's instructions per gRPC `ShouldRateLimit` call, counted by callgrind: a measure
# that does not move with the load on the machine (the timed CPU per call of
# `scripts/bench-daemon.sh` does). One `sluice serve` (one gRPC worker) runs under
# `valgrind --tool=callgrind`; `sluice bench` warms it up, the counters are zeroed, CALLS
# calls go (one hot key, 4 connections x 64 streams, as bench-daemon.sh), the counters are
# dumped; the total over all the server's threads is divided by the calls.
#
#   bash scripts/instructions-per-call.sh                       # this build
#   bash scripts/instructions-per-call.sh path/to/other/sluice  # another build, same generator
#   CALLS=100000 bash scripts/instructions-per-call.sh
#   callgrind_annotate --inclusive=yes "$OUT"/callgrind.out.*   # where they go (OUT kept)
#
# User-space instructions only (the kernel's are not counted), and the server runs about 50
# times slower under callgrind, so its batches of calls per wakeup are larger than at full
# speed: compare builds with it, and time them with bench-daemon.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

CALLS="${CALLS:-50000}"
PORT="${PORT:-18761}"
HTTP_PORT="${HTTP_PORT:-18762}"
OUT="${OUT:-$(mktemp -d)}"
command -v valgrind >/dev/null 2>&1 || {
  echo "valgrind missing (Debian: apt-get install valgrind)"; exit 1; }

cargo build --release --locked -p sluice
BENCH="${CARGO_TARGET_DIR:-target}/release/sluice"
BIN="${1:-$BENCH}"

cat >"$OUT/limits.yaml" <<'EOF'
domain: bench
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
EOF

valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out" \
  "$BIN" serve --config "$OUT/limits.yaml" --grpc-addr "127.0.0.1:$PORT" \
  --http-addr "127.0.0.1:$HTTP_PORT" --watch off --workers 1 2>"$OUT/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  if curl -sf "http://127.0.0.1:$HTTP_PORT/readyz" >/dev/null 2>&1 && kill -0 "$server" 2>/dev/null; then
    break
  fi
  sleep 0.2
done

load() { # calls
  "$BENCH" bench --grpc "127.0.0.1:$PORT" --requests "$1" --concurrency 256 --connections 4 \
    --domain bench --descriptor k=hot --json 2>/dev/null
}
load 5000 >/dev/null
callgrind_control -z "$server" >/dev/null
load "$CALLS" >"$OUT/bench.json"
callgrind_control -d "$server" >/dev/null
kill "$server"; wait "$server" 2>/dev/null || true
trap - EXIT

dump="$(ls -t "$OUT"/callgrind.out.* | head -n 1)"
python3 - "$dump" "$OUT/bench.json" <<'EOF'
import json, re, sys
dump, bench = sys.argv[1:]
total = next(int(m.group(1)) for line in open(dump)
             if (m := re.match(r"(?:summary|totals): (\d+)", line)))
r = json.load(open(bench))
calls = r["ok"] + r["over_limit"] + r["errors"]
print(f"{total:,} instructions / {calls:,} calls = {total / calls:,.0f} per call"
      f" ({r['errors']} errors); profile: {dump}")
EOF
