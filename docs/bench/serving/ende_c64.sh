#!/usr/bin/env bash
# The embedded pair at concurrency 64 (docs/serving.md): run.sh ende's servers and table (ende_table.json, from
# its tuner run), only the level whose table entry is plain (above 16 active slots). Nothing else running.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
OUT=docs/bench/serving
common="--slots=64 --max_input_length=64 --max_new_tokens=64 --modes=greedy --log_level=warning"
$PY launch/serve.py --port=8100 $common --speculation_table=$OUT/ende_table.json > /dev/null 2>&1 &
p1=$!
$PY launch/serve.py --port=8101 $common --draft=none > /dev/null 2>&1 &
p2=$!
trap 'kill $p1 $p2 2>/dev/null || true' EXIT
for port in 8100 8101; do
  for _ in $(seq 1 600); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 2; done
done
$PY launch/serve_benchmark.py --url=http://127.0.0.1:8100 --baseline_url=http://127.0.0.1:8101 \
    --labels=speculative,plain --workload=docs/bench/serving_ende.jsonl --max_tokens=64 \
    --concurrency=64 --requests=128 --rounds=2 --output=$OUT/ende_c64
