#!/usr/bin/env bash
# The serving benchmark of docs/serving.md: speculative against plain servers, the same slots and lengths, on
# this machine, one pair at a time (nothing else running). Usage: bash docs/bench/serving/run.sh ende|qwen
# QWEN_1_5B / QWEN_0_5B: the converted Qwen2.5-Coder directories (launch/convert_gguf.py, ../shared/MODELS.md).
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
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
case "${1:-ende}" in
  ende)
    # The load table: the tuner over batch sizes (greedy; chains of 2 and 4 against plain decoding).
    $PY launch/tune.py --drafts=ende-draft --gammas=2,4 --schedules=constant --temperatures=0 \
        --batch_sizes=1,4,16,64 --sentences=16 --max_new_tokens=48 --repeats=3 --noitl \
        --output_dir=runs/serving_tune --speculation_table=$OUT/ende_table.json
    common="--slots=64 --max_input_length=64 --max_new_tokens=64 --modes=greedy --log_level=warning"
    $PY launch/serve.py --port=8100 $common --speculation_table=$OUT/ende_table.json & pids+=($!)
    $PY launch/serve.py --port=8101 $common --draft=none & pids+=($!)
    wait_ready 8100; wait_ready 8101
    $PY launch/serve_benchmark.py --url=http://127.0.0.1:8100 --baseline_url=http://127.0.0.1:8101 \
        --labels=speculative,plain --workload=docs/bench/serving_ende.jsonl --max_tokens=64 \
        --concurrency=1,4,16,64 --rate=8 --requests=128 --output=$OUT/ende
    ;;
  qwen)
    # The load table from the tuner's earlier Qwen measurements (docs/bench/trees_qwen.md: the gamma-4 chain
    # 1.29x plain at batch 1, 1.02x at batch 4): draft up to 4 active slots, plain above.
    echo '{"entries": [{"max_active": 4, "gamma": 4, "tree": null}, {"max_active": 16, "gamma": 0, "tree": null}]}' \
        > $OUT/qwen_table.json
    common="--target=$QWEN_1_5B --slots=16 --max_input_length=128 --max_new_tokens=48 --modes=greedy --log_level=warning"
    $PY launch/serve.py --port=8100 $common --draft=$QWEN_0_5B --speculation_table=$OUT/qwen_table.json & pids+=($!)
    wait_ready 8100
    $PY launch/serve.py --port=8101 $common --draft=none & pids+=($!)
    wait_ready 8101
    $PY launch/serve_benchmark.py --url=http://127.0.0.1:8100 --baseline_url=http://127.0.0.1:8101 \
        --labels=speculative,plain --workload=docs/bench/qwen_prompts.jsonl --max_tokens=48 \
        --concurrency=1,4,16 --requests=${QWEN_REQUESTS:-0} --output=$OUT/qwen
    ;;
esac
