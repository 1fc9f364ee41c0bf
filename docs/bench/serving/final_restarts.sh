#!/usr/bin/env bash
# final.sh with new server processes every round: the peers' grid on the embedded pair (issue 39 item 4), the
# budget, a fixed gamma 4 and plain, c=1..64, 128 requests a level and round (REQUESTS), 6 rounds (ROUNDS), the
# arms' order alternating; before each round restarts.sh starts the three servers afresh (the rounds outermost,
# each running every level). Nothing else running. Writes final_restarts.{md,json,png}, the budget servers' logs
# (every round's cost curves) and the last budget server's /metrics.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-docs/bench/serving/final_restarts} PIDS=$(mktemp) JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxspec_bench_cache}
trap 'kill $(cat $PIDS) 2>/dev/null; rm -f $PIDS' EXIT
rm -f ${OUT}_budget.log
.venv/bin/python launch/serve_benchmark.py --servers=budget=http://127.0.0.1:8260,fixed=http://127.0.0.1:8261,plain=http://127.0.0.1:8262 \
  --workload=docs/bench/serving_ende.jsonl --max_tokens=64 --concurrency=${CONCURRENCY:-1,4,8,16,32,64} --requests=${REQUESTS:-128} \
  --rounds=${ROUNDS:-6} --timeout=900 --before_round="bash docs/bench/serving/restarts.sh" --output=$OUT
curl -s http://127.0.0.1:8260/metrics | grep -E "^jaxspec_(step_cost|steps_total|draft|accepted|verif)" > ${OUT}_budget_metrics.txt
date
