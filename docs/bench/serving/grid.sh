#!/usr/bin/env bash
# The peers' grid (issue 39 item 4): plain, a fixed gamma and the verification budget (the server's default with a
# draft) at concurrency 1 / 4 / 8 / 16 / 32 / 64 in one run, the arms' order alternating per round, each against
# plain. Nothing else running. PAIR=ende (the embedded pair, default) or PAIR=qwen (QWEN_1_5B / QWEN_0_5B the
# target's and the draft's directories, as qwen_rounds.sh). CONCURRENCY, ROUNDS, REQUESTS (0: 2 x concurrency),
# SLOTS (64) and ARMS (budget,fixed,plain: the servers started, plain always last; three Qwen servers need ~31 GB,
# so on a 24 GB machine the Qwen pair runs ARMS=budget,plain and ARMS=fixed,plain) override the grid. Writes
# docs/bench/serving/grid_$PAIR[_$TAG].{md,json,png} and the budget server's cost curves. The budget server starts
# first and alone (its warm-up times the step costs it chooses by; beside other servers' compilation they were
# up to 12 % off).
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
OUT=docs/bench/serving
PAIR=${PAIR:-ende}
SLOTS=${SLOTS:-64}
ARMS=${ARMS:-budget,fixed,plain}
NAME=grid_${PAIR}${TAG:+_$TAG}
if [ "$PAIR" = ende ]; then
  models="" draft="" workload=docs/bench/serving_ende.jsonl max_tokens=64
  common="--slots=$SLOTS --max_input_length=64 --max_new_tokens=64 --modes=greedy --log_level=warning"
else
  models="--target=${QWEN_1_5B}" draft="--draft=${QWEN_0_5B}" workload=docs/bench/qwen_prompts.jsonl max_tokens=48
  common="--slots=$SLOTS --max_input_length=128 --max_new_tokens=48 --modes=greedy --log_level=warning"
fi
pids=() servers=()
port=8100
for arm in ${ARMS//,/ }; do
  case $arm in
    budget) $PY launch/serve.py --port=$port $models $draft $common --gamma=4 > $OUT/${NAME}_budget.log 2>&1 & ;;
    fixed) $PY launch/serve.py --port=$port $models $draft $common --gamma=4 --speculation=fixed > /dev/null 2>&1 & ;;
    plain) $PY launch/serve.py --port=$port $models $common --draft=none > /dev/null 2>&1 & ;;
    *) echo "unknown arm $arm (budget, fixed, plain)" >&2; exit 2 ;;
  esac
  pids+=($!) servers+=("$arm=http://127.0.0.1:$port")
  trap 'kill ${pids[*]} 2>/dev/null || true' EXIT
  if [ "$arm" = budget ]; then  # its warm-up times the step-cost curves: alone, not beside other compilations
    for _ in $(seq 1 900); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 2; done
  fi
  port=$((port + 1))
done
for s in "${servers[@]}"; do
  for _ in $(seq 1 900); do curl -sf ${s#*=}/health >/dev/null && break; sleep 2; done
done
$PY launch/serve_benchmark.py --servers=$(IFS=,; echo "${servers[*]}") \
    --workload=$workload --max_tokens=$max_tokens --concurrency=${CONCURRENCY:-1,4,8,16,32,64} \
    --requests=${REQUESTS:-0} --rounds=${ROUNDS:-2} --timeout=900 --output=$OUT/$NAME
if [[ ,$ARMS, == *,budget,* ]]; then
  curl -s http://127.0.0.1:8100/metrics | grep -E '^jaxspec_(step_cost_seconds|steps_total)' > $OUT/${NAME}_budget_metrics.txt
fi
