#!/usr/bin/env bash
# Issue 38's serving check with an A/A control: several servers of the embedded pair under the tuned table
# (ende_table.json), each a checkout given as DIR:LABEL in ARMS (the same checkout twice measures the spread of two
# identical servers), alternating rounds (A B C, C B A, ...) at CONCURRENCY. Nothing else running.
#   git worktree add --detach ../wt-old 43f92ce && ln -s $PWD/.venv ../wt-old/.venv
#   ARMS=".:now_a ../wt-old:before .:now_b" bash docs/bench/serving/round4_aa.sh            # round4_aa.*
#   ARMS="../wt-5b14daf:5b14daf ../wt-7fd999c:7fd999c ../wt-6c928b3:6c928b3 .:main" CONCURRENCY=1 REQUESTS=128 \
#     TAG=round4_bisect_c1 bash docs/bench/serving/round4_aa.sh                              # round4_bisect_c1.*
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
OUT=docs/bench/serving
ARMS=${ARMS:-.:now_a ../wt-old:before .:now_b}
common="--slots=64 --max_input_length=64 --max_new_tokens=64 --modes=greedy --log_level=warning"
pids=() servers=()
port=8210
trap 'kill ${pids[*]} 2>/dev/null || true' EXIT
for arm in $ARMS; do
  dir=${arm%%:*} label=${arm#*:}
  (cd "$dir" && PYTHONPATH=$PWD exec .venv/bin/python launch/serve.py --port=$port $common \
      --speculation_table=$ROOT/$OUT/ende_table.json > /dev/null 2>&1) & pids+=($!)
  servers+=("$label=http://127.0.0.1:$port")
  port=$((port + 1))
  sleep 50  # the warm-ups one after the other (2 cores)
done
for s in "${servers[@]}"; do  # bounded: 20 minutes at most per server
  for _ in $(seq 1 600); do curl -sf "${s#*=}/health" >/dev/null && break; sleep 2; done
done
.venv/bin/python launch/serve_benchmark.py --servers=$(IFS=,; echo "${servers[*]}") \
    --workload=docs/bench/serving_ende.jsonl --max_tokens=64 --concurrency=${CONCURRENCY:-1,16} \
    --requests=${REQUESTS:-256} --rounds=${ROUNDS:-4} --timeout=900 --output=$OUT/${TAG:-round4_aa}
