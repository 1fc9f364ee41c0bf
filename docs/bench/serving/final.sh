#!/usr/bin/env bash
# The peers' grid on the embedded pair (issue 39 item 4): the budget (the server's default), a fixed gamma 4 and
# plain, c=1..64, 128 requests a level and round (REQUESTS), 6 rounds (ROUNDS) with the arms' order alternating;
# the budget server warms up alone. Nothing else running. Writes final.{md,json,png} and the budget server's
# /metrics after the run.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source docs/bench/serving/embedded_servers.sh
out=docs/bench/serving/final
.venv/bin/python launch/serve.py --port=8260 $common --gamma=4 > ${out}_budget.log 2>&1 & pids+=($!); wait_port 8260
.venv/bin/python launch/serve.py --port=8261 $common --gamma=4 --speculation=fixed > /dev/null 2>&1 & pids+=($!)
.venv/bin/python launch/serve.py --port=8262 $common --draft=none > /dev/null 2>&1 & pids+=($!)
wait_port 8261; wait_port 8262
.venv/bin/python launch/serve_benchmark.py --servers=budget=http://127.0.0.1:8260,fixed=http://127.0.0.1:8261,plain=http://127.0.0.1:8262 \
  --workload=docs/bench/serving_ende.jsonl --max_tokens=64 --concurrency=1,4,8,16,32,64 --requests=${REQUESTS:-128} --rounds=${ROUNDS:-6} \
  --timeout=900 --output=$out
curl -s http://127.0.0.1:8260/metrics | grep -E "^jaxspec_(step_cost|steps_total|draft|accepted|verif)" > ${out}_budget_metrics.txt
date
