#!/usr/bin/env bash
# The Qwen pair at one concurrency, the servers alternating over 2 rounds (docs/serving.md): the same servers as
# docs/bench/serving/run.sh qwen. CONCURRENCY (default 16) and REQUESTS a round (default 16); writes
# docs/bench/serving/qwen_c$CONCURRENCY.{md,json,png}. Nothing else running.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=.venv/bin/python
C=${CONCURRENCY:-16}
N=${REQUESTS:-16}
common="--target=${QWEN_1_5B} --slots=16 --max_input_length=128 --max_new_tokens=48 --modes=greedy --log_level=warning"
$PY launch/serve.py --port=8200 $common --draft=${QWEN_0_5B} --speculation_table=docs/bench/serving/qwen_table.json > /dev/null 2>&1 &
p1=$!
$PY launch/serve.py --port=8201 $common --draft=none > /dev/null 2>&1 &
p2=$!
trap 'kill $p1 $p2 2>/dev/null || true' EXIT
for port in 8200 8201; do
  for _ in $(seq 1 400); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 3; done
done
$PY launch/serve_benchmark.py --url=http://127.0.0.1:8200 --baseline_url=http://127.0.0.1:8201 \
    --labels=speculative,plain --workload=docs/bench/qwen_prompts.jsonl --max_tokens=48 \
    --concurrency=$C --requests=$N --rounds=2 --timeout=900 --output=docs/bench/serving/qwen_c$C
