#!/usr/bin/env bash
# Issue 38's check that the slot engine on its new rails serves as fast as before, and issue 39's first token:
# the embedded pair under the tuned load table (ende_table.json), this checkout's server against the one at
# OLD (a checkout of the commit before; default 43f92ce in ../wt-old), alternating rounds (A B, B A) at
# concurrency 1 and 16; then this checkout's speculative server against its plain one at concurrency 1 (TTFT).
# Nothing else running. Usage: OLD=../wt-old bash docs/bench/serving/round4_check.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
OLD=${OLD:-../wt-old}
OUT=docs/bench/serving
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_ready() {  # bounded: 20 minutes at most per server
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$1/health" >/dev/null; then return 0; fi
    sleep 2
  done
  echo "server on port $1 not ready" >&2; return 1
}
common="--slots=64 --max_input_length=64 --max_new_tokens=64 --modes=greedy --log_level=warning"
PYTHONPATH=$PWD $PY launch/serve.py --port=8100 $common --speculation_table=$OUT/ende_table.json & pids+=($!)
(cd "$OLD" && PYTHONPATH=$PWD $PY launch/serve.py --port=8101 $common \
    --speculation_table=$OLDPWD/$OUT/ende_table.json) & pids+=($!)
PYTHONPATH=$PWD $PY launch/serve.py --port=8102 $common --draft=none & pids+=($!)
wait_ready 8100; wait_ready 8101; wait_ready 8102
PYTHONPATH=$PWD $PY launch/serve_benchmark.py --url=http://127.0.0.1:8100 --baseline_url=http://127.0.0.1:8101 \
    --labels=now,before --workload=docs/bench/serving_ende.jsonl --max_tokens=64 \
    --concurrency=1,16 --requests=64 --rounds=2 --output=$OUT/round4_rails
PYTHONPATH=$PWD $PY launch/serve_benchmark.py --url=http://127.0.0.1:8100 --baseline_url=http://127.0.0.1:8102 \
    --labels=speculative,plain --workload=docs/bench/serving_ende.jsonl --max_tokens=64 \
    --concurrency=1 --requests=64 --rounds=2 --output=$OUT/round4_ttft
