#!/usr/bin/env bash
# Trains an EN-DE pair on one GPU and embeds it as ende-target / ende-draft (docs/ende_pair.md, the 29M target):
#   1. the target (configs/ende.py:target_gpu, ~29M params, the shipped tokenizer), keeping the best dev loss;
#   2. its greedy translations of 50k training sources (sequence-level distillation data);
#   3. the draft from scratch on them, with token-level KL to the target (configs/ende.py:draft_gpu);
#   4. both copied into jaxspec/embedded/ as bfloat16 safetensors.
# Expects the corpus in .gpu/data/ (train.tsv.gz, dev.tsv: copies of ../shared/data/ende). Every stage resumes
# where it stopped, so a run cut short is finished by running this again. On one H100 it took 8.5 minutes
# (target 3.9, distillation 0.9, draft 3.3, exports 0.4).
#
#   mkdir -p .gpu/data && cp ../shared/data/ende/{train.tsv.gz,dev.tsv} .gpu/data/ && bash launch/train_pair_gpu.sh
set -euo pipefail
work=.gpuwork
python3 launch/train.py --config=configs/ende.py:target_gpu --workdir=$work/target
python3 launch/distill_corpus.py --target=$work/target/export --train=.gpu/data/train.tsv.gz \
  --output=$work/distill/train.tsv.gz --max_pairs=50000 --batch_size=256
python3 launch/train.py --config=configs/ende.py:draft_gpu --workdir=$work/draft
python3 launch/export_embedded.py --source=$work/target/export --name=ende-target
python3 launch/export_embedded.py --source=$work/draft/export --name=ende-draft
