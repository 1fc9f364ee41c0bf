#!/usr/bin/env bash
# The peers' grid (issue 39 item 4): plain, a fixed gamma and the verification budget (the server's default with a
# draft) at concurrency 1 / 4 / 8 / 16 / 32 / 64 in one run, the arms' order alternating per round, each against
# plain. Nothing else running. PAIR=ende (the embedded pair, default) or PAIR=qwen (QWEN_1_5B / QWEN_0_5B the
# target's and the draft's directories, as qwen_rounds.sh). CONCURRENCY, ROUNDS, REQUESTS (0: 2 x concurrency)
# override the grid. Writes docs/bench/serving/grid_$PAIR.{md,json,png} and the budget server's cost curves.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
OUT=docs/bench/serving
PAIR=${PAIR:-ende}
if [ "$PAIR" = ende ]; then
  models="" draft="" workload=docs/bench/serving_ende.jsonl max_tokens=64
  common="--slots=64 --max_input_length=64 --max_new_tokens=64 --modes=greedy --log_level=warning"
else
  models="--target=${QWEN_1_5B}" draft="--draft=${QWEN_0_5B}" workload=docs/bench/qwen_prompts.jsonl max_tokens=48
  common="--slots=64 --max_input_length=128 --max_new_tokens=48 --modes=greedy --log_level=warning"
fi
$PY launch/serve.py --port=8100 $models $draft $common --gamma=4 > $OUT/grid_${PAIR}_budget.log 2>&1 &
p1=$!
$PY launch/serve.py --port=8101 $models $draft $common --gamma=4 --speculation=fixed > /dev/null 2>&1 &
p2=$!
$PY launch/serve.py --port=8102 $models $common --draft=none > /dev/null 2>&1 &
p3=$!
trap 'kill $p1 $p2 $p3 2>/dev/null || true' EXIT
for port in 8100 8101 8102; do
  for _ in $(seq 1 900); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 2; done
done
$PY launch/serve_benchmark.py \
    --servers=budget=http://127.0.0.1:8100,fixed=http://127.0.0.1:8101,plain=http://127.0.0.1:8102 \
    --workload=$workload --max_tokens=$max_tokens --concurrency=${CONCURRENCY:-1,4,8,16,32,64} \
    --requests=${REQUESTS:-0} --rounds=${ROUNDS:-2} --timeout=900 --output=$OUT/grid_${PAIR}
curl -s http://127.0.0.1:8100/metrics | grep -E '^jaxspec_(step_cost_seconds|steps_total)' > $OUT/grid_${PAIR}_budget_metrics.txt
