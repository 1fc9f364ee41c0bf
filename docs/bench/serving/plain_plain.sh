#!/usr/bin/env bash
# The method's control: two identical plain servers (embedded target, 64 slots) side by side as final.sh runs its
# arms, c=8,16,32,64 (CONCURRENCY; OUT: the output stem), 128 requests a level and round, 6 rounds with their order
# alternating. Nothing else running. plain_plain_c1.*: CONCURRENCY=1 OUT=docs/bench/serving/plain_plain_c1.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source docs/bench/serving/embedded_servers.sh
out=${OUT:-docs/bench/serving/plain_plain}
.venv/bin/python launch/serve.py --port=8270 $common --draft=none > /dev/null 2>&1 & pids+=($!); wait_port 8270
.venv/bin/python launch/serve.py --port=8271 $common --draft=none > /dev/null 2>&1 & pids+=($!); wait_port 8271
.venv/bin/python launch/serve_benchmark.py --servers=plainA=http://127.0.0.1:8270,plainB=http://127.0.0.1:8271 \
  --workload=docs/bench/serving_ende.jsonl --max_tokens=64 --concurrency=${CONCURRENCY:-8,16,32,64} --requests=128 --rounds=6 \
  --timeout=900 --output=$out
date
