#!/usr/bin/env bash
# final_restarts.sh's --before_round (serve_benchmark.py): stops the round before's servers (their pids in the file
# $PIDS) and starts the embedded pair's three arms afresh: the budget (the server's default) on 8260, warming up
# alone, then a fixed gamma 4 on 8261 and plain on 8262; returns once all three answer. Each round's servers are
# new processes, so what one process keeps through a run (plain_plain.sh: two processes of one plain server 13 %
# apart at c=16, every round) falls on each arm by chance. With JAX's persistent compilation cache
# ($JAX_COMPILATION_CACHE_DIR, which final_restarts.sh sets) a restart takes about 45 s instead of 95.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source docs/bench/serving/embedded_servers.sh
trap - EXIT  # the servers outlive this script: final_restarts.sh stops the last round's
kill $(cat "$PIDS") 2>/dev/null; for pid in $(cat "$PIDS"); do while kill -0 $pid 2>/dev/null; do sleep 0.2; done; done
log=${OUT:-/tmp/restarts}_budget.log
echo "== round ${ROUND:-?}" >> $log
.venv/bin/python launch/serve.py --port=8260 $common --gamma=4 >> $log 2>&1 & echo $! > "$PIDS"; wait_port 8260
.venv/bin/python launch/serve.py --port=8261 $common --gamma=4 --speculation=fixed > /dev/null 2>&1 & echo $! >> "$PIDS"
.venv/bin/python launch/serve.py --port=8262 $common --draft=none > /dev/null 2>&1 & echo $! >> "$PIDS"
wait_port 8261 && wait_port 8262
