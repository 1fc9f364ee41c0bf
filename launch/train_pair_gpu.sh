#!/usr/bin/env bash
# The v2 EN-DE pair on one lent GPU, in one device call of under 9.5 minutes (docs/ende_pair.md, "v2: how to
# train"): launch/train_pair_v2.py trains the target, distils training sources with it, trains the draft on them,
# and packs both into $OUT (ende-target.tar.part00-03, ende-draft.tar.part00, summary.json, log.txt: 7 files,
# each < 15 MB, ~60 MB in all).
#
# Prepared on the CPU side (ignored paths, carried to the device):
#   mkdir -p runs/corpus && cp /work/corpus/{train.tsv.gz,dev.tsv,test.tsv,dev_doc.tsv,test_doc.tsv} runs/corpus/
#   .venv/bin/pip download --no-deps ml_collections==1.1.0 -d runs/wheels     # the device lacks ml_collections
# Then one `run` call: command "bash launch/train_pair_gpu.sh", carry ["runs/corpus", "runs/wheels"],
# timeout_s 600. Extra arguments go to launch/train_pair_v2.py (e.g. --target_config.dropout_rate=0.2).
# XLA_GPU_AUTOTUNE_LEVEL=N (0 = no autotuning: shorter compiles, maybe slower steps; XLA's default is 4) is passed
# as --xla_gpu_autotune_level=N in XLA_FLAGS; summary.json records the flags ("environment") and each compile's
# and the steps' seconds ("target"/"draft" -> "timings"): compare compile_s and steps_per_s between two runs.
set -euo pipefail
# Dropout masks from XLA's RngBitGenerator rather than threefry's hash, which JAX documents as the cheaper key type on
# accelerators (the masks change, nothing else; tests/training/test_pair_v2_pipeline.py passes with it).
export JAX_DEFAULT_PRNG_IMPL=${JAX_DEFAULT_PRNG_IMPL:-rbg}
if [[ -n "${XLA_GPU_AUTOTUNE_LEVEL:-}" ]]; then
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=${XLA_GPU_AUTOTUNE_LEVEL}"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  runs/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
out=${OUT:-runs/pair_v2/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader || true
python3 launch/train_pair_v2.py --corpus=runs/corpus --out="$out" --verbosity=-1 "$@" 2>&1 | tee "$out/log.txt"
