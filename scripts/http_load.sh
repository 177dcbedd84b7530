#!/usr/bin/env bash
# HTTP load on loopback: bare axum vs ThrottleLayer vs tower_governor, keyed
# by a user header over 10,000 users (allowed path) and one user flooding a
# denied key (denied path). Requests/s and p99 from wrk; each run is bounded.
#
#   bash scripts/http_load.sh            # 10 s per run, 64 connections
#   SECS=5 CONNS=32 bash scripts/http_load.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-10}
CONNS=${CONNS:-64}
PORT=${PORT:-38080}

command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
cargo build --release --example bench_server 2>&1 | tail -1
server=target/release/examples/bench_server

lua=$(mktemp --suffix=.lua)
# Only a server still running: `kill 0` would signal this whole process group.
trap 'rm -f "$lua"; if [ -n "${pid:-}" ]; then kill "$pid" 2>/dev/null || true; fi' EXIT
run() { # path mode users
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
  printf '| %s | %s | %s | %s | %s |\n' "$1" "$2" "$rps" "$p99" "${non2xx:-0}"
}

echo "| path | server | requests/s | p99 | non-2xx responses |"
echo "|---|---|---:|---:|---:|"
for mode in bare throttle governor; do run allowed "$mode" 10000; done
for mode in bare throttle governor; do run denied "$mode" 1; done
