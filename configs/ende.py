"""The embedded EN-DE pair.

Shipped pair: `target`, then `draft`, then `draft_seqkd` (on the CPU). `target_gpu` / `draft_gpu` made a better
translator on a lent H100 that is measured but not shipped (docs/ende_pair.md has the commands and why).

target: gated-GELU T5 (as T5 1.1) with a tied, scaled embedding (as T5 1.0), ~18M parameters; its decoder
  weights (~50 MB in float32) do not fit the 32 MB L3 cache. Sized to train about one epoch in an hour on the
  project's 2-core CPU (~0.3 steps/s); docs/ende_pair.md has the measured costs behind that choice.
target_gpu: the same design at ~29M parameters, trained ~7 epochs on one GPU in ~4 minutes, exported at its best
  dev loss (the model has no dropout and overfits this corpus after that).
draft: ~2M parameters, distilled token by token from the trained target (the shipped one by default); its
  decoder step costs a few percent of the target's (c ~ 0.03 on the project's CPUs).
draft_seqkd: the draft continued on the target's own greedy translations of training sources (sequence-level
  distillation; corpus from launch/distill_corpus.py), still with token-level KL: it learns what the target
  says, not what the references say, which is what acceptance measures.
draft_gpu: the draft's shape trained from scratch that way on a GPU (the first lease's stage 3).

Pair v2 (launch/train_pair_v2.py: both on one lent H100 in one 9.5-minute call; docs/ende_pair.md, "v2"):
target_v2: ~25.6M parameters (d_model 512, 4 encoder / 3 decoder layers, d_ff 1024), the v2 tokenizer
  (configs/ende_tokenizer, trained on the bigger corpus of docs/corpus.md), dropout 0.1 and label smoothing 0.1
  against overfitting ~15 epochs, float32 compute (bfloat16 ran ~10x slower on an H200), natural sentences twice per epoch, ~5.5 minutes of training
  (a time budget; the learning rate decays over it), exported at its best dev loss.
draft_v2: ~3.5M parameters, shallow and wide (d_model 192, 2 encoder / 1 decoder layer, d_ff 768): as many
  multiply-adds per decoder step as a 4-layer d_model 128 decoder, in a quarter of the sequential kernels, which
  is what a step costs on this CPU and on a GPU. Trained on target_v2's greedy translations with token-level KL
  to it (the pipeline sets train, dev and teacher).
"""

import os

import ml_collections
from ml_collections import config_dict

CONFIGS = ("target", "draft", "draft_seqkd", "target_gpu", "draft_gpu", "target_v2", "draft_v2")
# The v2 pair's sentencepiece tokenizer (8,000 pieces): see docs/ende_pair.md for how it was trained.
TOKENIZER_V2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ende_tokenizer")


def _model(d_model: int, d_ff: int, num_layers: int, num_decoder_layers: int, num_heads: int, d_kv: int) -> dict:
  """Gated-GELU T5 (as T5 1.1) with a tied, scaled embedding (as T5 1.0)."""
  return dict(d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=num_layers, num_decoder_layers=num_decoder_layers,
              num_heads=num_heads, activation="gelu_new", gated=True, tie_word_embeddings=True,
              scale_decoder_outputs=True)


def get_config(which: str = "target") -> ml_collections.ConfigDict:
  if which not in CONFIGS:
    raise ValueError(f"configs/ende.py takes one of {', '.join(CONFIGS)}, got {which!r}.")
  c = ml_collections.ConfigDict()
  # T5Config fields besides vocab_size (the tokenizer's):
  c.model = _model(d_model=384, d_ff=1024, num_layers=3, num_decoder_layers=4, num_heads=6, d_kv=64)
  c.tokenizer = "ende-target"  # Tokenizer directory (launch/train_tokenizer.py) or embedded model name.
  c.data_dir = ""  # EN-DE corpus directory ("" = jaxspec.data.ende.default_data_dir(), $JAXSPEC_ENDE_DATA).
  c.train = ""  # Training TSV ("" = data_dir/train.tsv.gz).
  c.max_len = 64  # Longer pairs are truncated (EOS kept); ~99% of the corpus is shorter.
  c.length_buckets = ""  # Padded lengths, e.g. "16,32,64" ("" = 8, 16, 24, 32, 48, 64, ...); one compile each.
  c.tokens_per_batch = 2048  # Padded tokens per side per batch; batches are grouped by length bucket.
  c.natural_repeat = 1  # Natural (Ding) sentences are seen this many times per epoch.
  c.learning_rate = 1e-3  # AdamW peak, after linear warm-up, then cosine decay to 5%.
  c.warmup_steps = 100  # Linear warm-up steps.
  c.train_steps = 1300  # Optimizer steps in all (a resumed run continues to this step).
  c.weight_decay = 0.01  # AdamW weight decay.
  c.dropout_rate = 0.0  # Dropout in training (embeddings, sublayer outputs, final hidden states); 0 = none.
  c.label_smoothing = 0.0  # Weight of the uniform distribution in the cross-entropy target.
  c.compute_dtype = "float32"  # "bfloat16": mixed precision on an accelerator (float32 weights and optimizer).
  c.time_budget_s = 0.0  # > 0: stop this many seconds after the start, decaying the learning rate over them.
  c.init_from = ""  # Model directory or embedded name to start from instead of a random init ("" = random).
  c.teacher = ""  # Model directory or embedded name to distil from ("" = plain cross-entropy).
  c.distill_weight = 0.0  # Weight of KL(teacher || student) versus cross-entropy (> 0 needs a teacher).
  c.log_every = 25  # Steps between progress lines (steps/s, tokens/s, loss, ETA).
  c.eval_every = 300  # Steps between dev loss / BLEU evaluations.
  c.checkpoint_every = 100  # Steps between Orbax checkpoints (a killed run resumes from the latest); 0 = none.
  c.dev = ""  # Dev split(s) or TSV(s), comma-separated ("" = data_dir/dev.tsv).
  c.dev_loss_pairs = 1000  # Dev pairs for the dev loss, evenly spaced over the dev split(s).
  c.dev_bleu_sentences = 200  # Dev natural sentences translated greedily for BLEU.
  c.seed = 0  # Initialisation and data order.
  c.export_best = False  # Export the parameters of the evaluation with the lowest dev loss, not the last ones.
  if which in ("draft", "draft_seqkd", "draft_gpu"):
    c.model = _model(d_model=128, d_ff=512, num_layers=1, num_decoder_layers=2, num_heads=4, d_kv=32)
    c.learning_rate = 2e-3
    c.warmup_steps = 30
    c.train_steps = 300
    c.eval_every = 150
    c.teacher = "ende-target"  # The shipped target (or WORKDIR/export of a target trained with "target").
    c.distill_weight = 0.9  # Mostly match the target's distributions: that is what raises acceptance.
  if which == "draft_seqkd":
    # Starts from the shipped models (bfloat16 storage, loaded as float32): the draft learns the target users run.
    c.init_from = "ende-draft"  # Before this step: the token-level distilled draft.
    c.train = config_dict.placeholder(str)  # Required: launch/distill_corpus.py --target=ende-target's output.
    c.distill_weight = 0.5
    c.learning_rate = 1e-3
    c.train_steps = 800
    c.eval_every = 400
  if which in ("target_gpu", "draft_gpu"):  # The first lease's pipeline (docs/ende_pair.md): one lent GPU.
    c.data_dir = ".gpu/data"  # Copies of the corpus next to the checkout on the GPU machine.
    c.tokens_per_batch = 16384
    c.log_every = 100
    c.checkpoint_every = 200
    c.export_best = True
  if which == "target_gpu":
    # ~29M parameters: a decoder (~16M without the embedding) well beyond the 32 MB L3 cache in float32, which
    # brings the CPU's verify-cost ratio r towards 1.5; 59 MB in bfloat16, so the pair stays under 80 MB.
    c.model = _model(d_model=512, d_ff=1280, num_layers=3, num_decoder_layers=4, num_heads=8, d_kv=64)
    c.learning_rate = 1e-3
    c.warmup_steps = 300
    c.train_steps = 1200  # ~10 epochs at 16k padded tokens a batch: without dropout, dev loss rises after ~7.
    c.weight_decay = 0.1
    c.eval_every = 200
  if which == "draft_gpu":
    # The shipped draft's shape, trained from scratch on the GPU target's own translations (sequence-level
    # distillation) with token-level KL to the target's distributions.
    c.train = ".gpuwork/distill/train.tsv.gz"
    c.teacher = ".gpuwork/target/export"
    c.distill_weight = 0.5
    c.learning_rate = 2e-3
    c.warmup_steps = 200
    c.train_steps = 1500
    c.eval_every = 1500
    c.dev_bleu_sentences = 32
  if which in ("target_v2", "draft_v2"):  # training/ende_pair.py sets data_dir (and the draft's data, teacher).
    c.tokenizer = TOKENIZER_V2
    c.dev = "dev,dev_doc"  # Natural sentences, software strings and documentation.
    c.max_len = 96  # 0.3% of the pairs are longer (documentation); 64 cut 2.6% of the documentation.
    c.length_buckets = "32,96"  # Two train programs (each compile took 24-34 s on an H200 for five buckets).
    c.tokens_per_batch = 16384
    c.natural_repeat = 2  # 14k natural sentences among 285k pairs; the BLEU aim is on them.
    # float32: on the H200 of 2026-11-28 the bfloat16 train step ran ~10x slower (233 against 22 ms for 16k tokens;
    # docs/experiments/pair_v2_h200_2026-11-28): the target got 863 steps in its 330 s and did not translate.
    c.compute_dtype = "float32"
    c.train_steps = 1_000_000  # A cap only: the time budget ends training.
    c.log_every = 200
    c.eval_every = 500
    c.checkpoint_every = 0  # One device call: nothing survives it but what the pipeline writes to $OUT.
    c.export_best = True
    c.dev_bleu_sentences = 0  # The pipeline measures BLEU per domain on the test splits after training.
  if which == "target_v2":
    c.model = _model(d_model=512, d_ff=1024, num_layers=4, num_decoder_layers=3, num_heads=8, d_kv=64)
    c.learning_rate = 1e-3
    c.warmup_steps = 400
    c.weight_decay = 0.1
    c.dropout_rate = 0.1
    c.label_smoothing = 0.1
    c.time_budget_s = 330.0
  if which == "draft_v2":
    c.model = _model(d_model=192, d_ff=768, num_layers=2, num_decoder_layers=1, num_heads=3, d_kv=64)
    c.train = config_dict.placeholder(str)  # The target's greedy translations (the pipeline's distill stage).
    c.teacher = ""  # The trained target_v2 (the pipeline sets it).
    c.distill_weight = 0.5
    c.learning_rate = 2e-3
    c.warmup_steps = 200
    c.weight_decay = 0.01
    c.time_budget_s = 90.0
  return c
