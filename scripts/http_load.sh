#!/usr/bin/env bash
# HTTP load on loopback: bare axum vs ThrottleLayer vs tower_governor, keyed
# by a user header over 10,000 users (allowed path) and one user flooding a
# denied key (denied path). The contenders run in rotating order over
# ROUNDS short rounds (bare, throttle, governor; then throttle, governor,
# bare; …), so a machine that drifts (another process, a turbo step) drifts
# under all of them; the report is each round's figures, then the median of
# the per-round ratios with their quartiles. Requests/s and p99 from wrk;
# each run is bounded.
#
#   bash scripts/http_load.sh                  # 7 rounds of 3 s, 64 connections
#   ROUNDS=9 SECS=2 CONNS=32 bash scripts/http_load.sh
#   PATHS=denied bash scripts/http_load.sh     # one path only
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-3}
ROUNDS=${ROUNDS:-7}
CONNS=${CONNS:-64}
PORT=${PORT:-38080}
PATHS=${PATHS:-allowed denied}

command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
cargo build --release --example bench_server 2>&1 | tail -1
server=target/release/examples/bench_server

lua=$(mktemp --suffix=.lua)
results=$(mktemp)
# Only a server still running: `kill 0` would signal this whole process group.
trap 'rm -f "$lua" "$results"; if [ -n "${pid:-}" ]; then kill "$pid" 2>/dev/null || true; fi' EXIT
run() { # path mode users round
  cat >"$lua" <<LUA
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", {["x-user"] = "user-" .. (n % $3)})
end
LUA
  "$server" "$2" "$1" "$PORT" & pid=$!
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
  out=$(timeout $((SECS + 20)) wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$lua" "http://127.0.0.1:$PORT/")
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$4" "$2" "$rps" "$p99" "${non2xx:-0}"
  printf '%s %s %s %s\n' "$1" "$4" "$2" "$rps" >>"$results"
}

echo "$(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2}'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); commit ${GIT_COMMIT:-$(git rev-parse --short HEAD)}; $ROUNDS rounds × ${SECS} s, $CONNS connections"
echo
echo "| path | round | server | requests/s | p99 | non-2xx responses |"
echo "|---|---:|---|---:|---:|---:|"
modes=(bare throttle governor)
for path in $PATHS; do
  users=10000
  [ "$path" = denied ] && users=1
  for round in $(seq "$ROUNDS"); do
    for i in 0 1 2; do
      run "$path" "${modes[$(((round + i) % 3))]}" "$users" "$round"
    done
  done
done

echo
echo "| path | ratio | median of per-round ratios | quartiles |"
echo "|---|---|---:|---|"
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    path, rnd, mode, rps = line.split()
    rows.setdefault(path, {}).setdefault(rnd, {})[mode] = float(rps)
for path, rounds in rows.items():
    for a, b in (("throttle", "bare"), ("governor", "bare"), ("throttle", "governor")):
        ratios = sorted(r[a] / r[b] for r in rounds.values() if r.get(b))
        if len(ratios) < 2:
            continue
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        print(f"| {path} | {a} ÷ {b} | {statistics.median(ratios):.3f} | [{q1:.3f}, {q3:.3f}] |")
PY
