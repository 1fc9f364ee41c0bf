#!/usr/bin/env bash
# The budget with --budget_margin=0.2 and 0 beside a fixed gamma 4 and plain, embedded pair, c=1..64, 2 alternating
# rounds (the budget servers warm up alone, one after the other). Nothing else running. Writes margins.{md,json,png}.
set -uo pipefail
cd "$(dirname "$0")/../../.."
common="--slots=64 --max_input_length=64 --max_new_tokens=64 --modes=greedy --log_level=warning"
pids=()
trap 'kill ${pids[*]} 2>/dev/null || true' EXIT
wait_port() { for _ in $(seq 1 600); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 2; done; }
.venv/bin/python launch/serve.py --port=8240 $common --gamma=4 --budget_margin=0.2 > /dev/null 2>&1 & pids+=($!); wait_port 8240
.venv/bin/python launch/serve.py --port=8241 $common --gamma=4 --budget_margin=0 > /dev/null 2>&1 & pids+=($!); wait_port 8241
.venv/bin/python launch/serve.py --port=8242 $common --gamma=4 --speculation=fixed > /dev/null 2>&1 & pids+=($!)
.venv/bin/python launch/serve.py --port=8243 $common --draft=none > /dev/null 2>&1 & pids+=($!)
wait_port 8242; wait_port 8243
.venv/bin/python launch/serve_benchmark.py --servers=margin02=http://127.0.0.1:8240,margin0=http://127.0.0.1:8241,fixed=http://127.0.0.1:8242,plain=http://127.0.0.1:8243 \
  --workload=docs/bench/serving_ende.jsonl --max_tokens=64 --concurrency=1,4,8,16,32,64 --requests=128 --rounds=2 \
  --timeout=900 --output=docs/bench/serving/margins
date
