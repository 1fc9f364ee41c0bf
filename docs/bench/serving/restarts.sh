#!/usr/bin/env bash
# serve_benchmark.py's --before_round for final_restarts.sh and plain_plain_restarts.sh: stops the round before's
# servers (their pids in the file $PIDS) and starts the embedded pair's servers named in ARMS afresh (default
# "budget fixed plain"; the first warms up alone, then the others together), returning once all of them answer:
#   budget: the server's default with the embedded draft, gamma 4, on 8260 (its log appended to ${OUT}_budget.log);
#   fixed: --speculation=fixed, gamma 4, on 8261; plain: --draft=none on 8262; plainB: another plain on 8263.
# Each round's servers are new processes, so what one process keeps through a run (plain_plain.sh: two processes
# of one plain server 13 % apart at c=16, every round) falls on each arm by chance. With JAX's persistent
# compilation cache ($JAX_COMPILATION_CACHE_DIR, which the callers set) a restart takes about 45 s instead of 95.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source docs/bench/serving/embedded_servers.sh
trap - EXIT  # the servers outlive this script: the caller stops the last round's
kill $(cat "$PIDS") 2>/dev/null; for pid in $(cat "$PIDS"); do while kill -0 $pid 2>/dev/null; do sleep 0.2; done; done
: > "$PIDS"
start() {  # start ARM: the server in the background, its pid in $PIDS; prints its port
  local port log=/dev/null
  case $1 in
    budget) port=8260; set -- --gamma=4; log=${OUT:-/tmp/restarts}_budget.log; echo "== round ${ROUND:-?}" >> $log;;
    fixed) port=8261; set -- --gamma=4 --speculation=fixed;;
    plain) port=8262; set -- --draft=none;;
    plainB) port=8263; set -- --draft=none;;
    *) echo "restarts.sh: unknown arm '$1' in ARMS (budget, fixed, plain, plainB)" >&2; exit 2;;
  esac
  .venv/bin/python launch/serve.py --port=$port $common "$@" >> $log 2>&1 & echo $! >> "$PIDS"
  echo $port
}
arms=(${ARMS:-budget fixed plain})
first=$(start ${arms[0]}) || exit 2
wait_port $first || exit 1
ports=()
for a in "${arms[@]:1}"; do ports+=($(start $a)) || exit 2; done
for p in "${ports[@]}"; do wait_port $p || exit 1; done
