#!/usr/bin/env bash
# The method's control with new server processes every round: two identical plain servers (embedded target, 64
# slots) as final_restarts.sh runs its arms (restarts.sh with ARMS="plain plainB" before each round), c=1..64
# (CONCURRENCY), 128 requests a level and round (REQUESTS), 6 rounds (ROUNDS), their order alternating. Nothing
# else running. Writes plain_plain_restarts.{md,json,png}.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-docs/bench/serving/plain_plain_restarts} PIDS=$(mktemp) ARMS="plain plainB"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxspec_bench_cache}
trap 'kill $(cat $PIDS) 2>/dev/null; rm -f $PIDS' EXIT
.venv/bin/python launch/serve_benchmark.py --servers=plainA=http://127.0.0.1:8262,plainB=http://127.0.0.1:8263 \
  --workload=docs/bench/serving_ende.jsonl --max_tokens=64 --concurrency=${CONCURRENCY:-1,4,8,16,32,64} --requests=${REQUESTS:-128} \
  --rounds=${ROUNDS:-6} --timeout=900 --before_round="bash docs/bench/serving/restarts.sh" --output=$OUT
date
