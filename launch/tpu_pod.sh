#!/usr/bin/env bash
# Runs jaxspec on a Cloud TPU VM slice: creates it (or reuses it), copies this checkout to every worker, installs
# it, and runs launch/translate.py or launch/benchmark.py on all workers at once. docs/tpu.md walks through it.
#
#   launch/tpu_pod.sh NAME ZONE ACCELERATOR translate|benchmark INPUT [extra flags for the script...]
#
#   launch/tpu_pod.sh jaxspec-v5e us-west4-a v5litepod-8 translate newstest2014.en --mesh=model:8
#   launch/tpu_pod.sh jaxspec-v4 us-central2-b v4-32 benchmark newstest2014.en --mesh=data:2,model:8
#
# INPUT: a text file (one input a line) or a TSV with an 'en' column, copied to every worker (inputs are read the
# same on all hosts). The pair defaults to the paper's: T5-11B target, T5-small draft, T5's En-De task prefix
# (override with TARGET, DRAFT, PREFIX). Every worker runs the same command; on a slice of several hosts
# JAXSPEC_DISTRIBUTED=1 makes the scripts call jax.distributed.initialize(), and only process 0 writes outputs,
# which are then copied back from worker 0 into ./tpu_out/.
#
# Environment: PROJECT (gcloud project, default: gcloud's), RUNTIME (TPU software version; default by accelerator),
# TARGET, DRAFT (Hub ids or paths on the workers), PREFIX, DELETE=1 deletes the slice after the run (default: kept
# for the next run, which reuses it; a slice costs money while it exists).
set -euo pipefail

if [[ $# -lt 5 ]]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
NAME=$1 ZONE=$2 ACCELERATOR=$3 SCRIPT=$4 INPUT=$5
shift 5
case "$SCRIPT" in translate|benchmark) ;; *) echo "error: script must be translate or benchmark, got $SCRIPT" >&2; exit 2;; esac
[[ -f "$INPUT" ]] || { echo "error: input file $INPUT does not exist" >&2; exit 2; }

TARGET=${TARGET:-google-t5/t5-11b}
DRAFT=${DRAFT:-google-t5/t5-small}
PREFIX=${PREFIX:-"translate English to German: "}
case "$ACCELERATOR" in
  v5litepod-*|v5e-*) DEFAULT_RUNTIME=v2-alpha-tpuv5-lite ;;
  v5p-*) DEFAULT_RUNTIME=v2-alpha-tpuv5 ;;
  *) DEFAULT_RUNTIME=tpu-ubuntu2204-base ;;
esac
RUNTIME=${RUNTIME:-$DEFAULT_RUNTIME}
GCLOUD=(gcloud compute tpus tpu-vm)
FLAGS=(--zone="$ZONE")
[[ -n "${PROJECT:-}" ]] && FLAGS+=(--project="$PROJECT")

# 1. Create the slice, or reuse one of that name.
if "${GCLOUD[@]}" describe "$NAME" "${FLAGS[@]}" >/dev/null 2>&1; then
  echo "reusing TPU VM $NAME"
else
  "${GCLOUD[@]}" create "$NAME" "${FLAGS[@]}" --accelerator-type="$ACCELERATOR" --version="$RUNTIME"
fi
HOSTS=$("${GCLOUD[@]}" describe "$NAME" "${FLAGS[@]}" --format='value(networkEndpoints[].ipAddress)' | tr ';,' '\n\n' | grep -c .)
DISTRIBUTED=$([[ "$HOSTS" -gt 1 ]] && echo 1 || echo 0)
echo "$NAME: $ACCELERATOR, $HOSTS host(s)"

# 2. Copy this checkout (without its virtual environment and build outputs) and the input to every worker.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ARCHIVE=$(mktemp -t jaxspec.XXXXXX.tar.gz)
tar -C "$ROOT" --exclude=.venv --exclude=.git --exclude='*.egg-info' --exclude=__pycache__ -czf "$ARCHIVE" .
"${GCLOUD[@]}" scp "$ARCHIVE" "$INPUT" "$NAME":~ "${FLAGS[@]}" --worker=all
rm -f "$ARCHIVE"
INPUT_NAME=$(basename "$INPUT")

# 3. Install on every worker (JAX for TPU, then jaxspec from the copy).
"${GCLOUD[@]}" ssh "$NAME" "${FLAGS[@]}" --worker=all --command="set -e
  rm -rf ~/jaxspec && mkdir -p ~/jaxspec && tar -xzf ~/$(basename "$ARCHIVE") -C ~/jaxspec
  cd ~/jaxspec && python3 -m venv .venv && .venv/bin/pip install -q -U pip
  .venv/bin/pip install -q 'jax[tpu]' -e ."

# 4. Run the same command on every worker; process 0 writes ~/tpu_out.
EXTRA=""
for arg in "$@"; do EXTRA+=" '$arg'"; done
OUTPUT_FLAG=$([[ "$SCRIPT" == translate ]] && echo "--output=\$HOME/tpu_out/$INPUT_NAME.de" || echo "--output_dir=\$HOME/tpu_out")
"${GCLOUD[@]}" ssh "$NAME" "${FLAGS[@]}" --worker=all --command="set -e
  mkdir -p ~/tpu_out && cd ~/jaxspec
  JAXSPEC_DISTRIBUTED=$DISTRIBUTED .venv/bin/python launch/$SCRIPT.py --target='$TARGET' --draft='$DRAFT' \
    --prefix='$PREFIX' --input=\$HOME/$INPUT_NAME $OUTPUT_FLAG$EXTRA"

# 5. Bring worker 0's outputs back.
mkdir -p tpu_out
"${GCLOUD[@]}" scp --recurse "$NAME":~/tpu_out/ ./tpu_out/ "${FLAGS[@]}" --worker=0
echo "outputs in ./tpu_out/"
if [[ "${DELETE:-0}" == 1 ]]; then
  "${GCLOUD[@]}" delete "$NAME" "${FLAGS[@]}" --quiet
fi
