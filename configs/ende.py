"""The embedded EN-DE pair.

Shipped pair: `target`, then `draft`, then `draft_seqkd` (on the CPU). `target_gpu` / `draft_gpu` made a better
translator on a lent H100 that is measured but not shipped (docs/ende_pair.md has the commands and why).

target: gated-GELU T5 (as T5 1.1) with a tied, scaled embedding (as T5 1.0), ~18M parameters; its decoder
  weights (~50 MB in float32) do not fit the 32 MB L3 cache. Sized to train about one epoch in an hour on the
  project's 2-core CPU (~0.3 steps/s); docs/ende_pair.md has the measured costs behind that choice.
target_gpu: the same design at ~29M parameters, trained ~7 epochs on one GPU in ~4 minutes, exported at its best
  dev loss (the model has no dropout and overfits this corpus after that).
draft: ~2M parameters, distilled token by token from the trained target; its decoder step costs a few percent
  of the target's (c ~ 0.03 on the project's CPUs).
draft_seqkd: the draft continued on the target's own greedy translations of training sources (sequence-level
  distillation; corpus from launch/distill_corpus.py), still with token-level KL: it learns what the target
  says, not what the references say, which is what acceptance measures.
draft_gpu: the draft's shape trained from scratch that way on a GPU (stage 3 of launch/train_pair_gpu.sh).
"""

import ml_collections


def get_config(which: str = "target") -> ml_collections.ConfigDict:
  if which not in ("target", "draft", "draft_seqkd", "target_gpu", "draft_gpu"):
    raise ValueError(f"configs/ende.py takes 'target', 'draft', 'draft_seqkd', 'target_gpu' or 'draft_gpu', "
                     f"got {which!r}.")
  c = ml_collections.ConfigDict()
  c.model = dict(d_model=384, d_kv=64, d_ff=1024, num_layers=3, num_decoder_layers=4, num_heads=6,
                 activation="gelu_new", gated=True, tie_word_embeddings=True, scale_decoder_outputs=True)
  c.tokenizer = "/tmp/work/tokenizer"  # Directory from launch/train_tokenizer.py (8k pieces, T5 special ids).
  c.train = "../shared/data/ende/train.tsv.gz"
  c.dev = "../shared/data/ende/dev.tsv"
  c.max_len = 64  # Longer pairs are truncated (EOS kept); ~99% of the corpus is shorter.
  c.tokens_per_batch = 2048  # Padded tokens per side per batch; batches are grouped by length bucket.
  c.learning_rate = 1e-3  # AdamW peak, after linear warm-up, then cosine decay to 5%.
  c.warmup_steps = 100
  c.train_steps = 1300
  c.weight_decay = 0.01
  c.init_from = ""  # Model directory or embedded name to start from instead of a random init ("" = random).
  c.teacher = ""  # Directory of a trained model to distil from ("" = plain cross-entropy).
  c.distill_weight = 0.0  # Weight of KL(teacher || student) versus cross-entropy.
  c.log_every = 25  # Steps between progress lines (steps/s, tokens/s, loss, ETA).
  c.eval_every = 300  # Steps between dev loss / BLEU evaluations.
  c.checkpoint_every = 100  # Steps between Orbax checkpoints (a killed run resumes from the latest).
  c.dev_loss_pairs = 1000  # Dev pairs for the dev loss.
  c.dev_bleu_sentences = 200  # Dev natural sentences translated greedily for BLEU.
  c.seed = 0
  c.export_best = False  # Export the parameters of the evaluation with the lowest dev loss, not the last ones.
  if which in ("draft", "draft_seqkd", "draft_gpu"):
    c.model = dict(d_model=128, d_kv=32, d_ff=512, num_layers=1, num_decoder_layers=2, num_heads=4,
                   activation="gelu_new", gated=True, tie_word_embeddings=True, scale_decoder_outputs=True)
    c.learning_rate = 2e-3
    c.warmup_steps = 30
    c.train_steps = 300
    c.eval_every = 150
    c.teacher = "/tmp/work/target/export"  # The target trained with this file's "target" config.
    c.distill_weight = 0.9  # Mostly match the target's distributions: that is what raises acceptance.
  if which == "draft_seqkd":
    # Starts from the shipped models (bfloat16 storage, loaded as float32): the draft learns the target users run.
    c.init_from = "ende-draft"  # Before this step: the token-level distilled draft.
    c.train = "/tmp/work/distill/train.tsv.gz"  # From launch/distill_corpus.py --target=ende-target.
    c.teacher = "ende-target"
    c.distill_weight = 0.5
    c.learning_rate = 1e-3
    c.train_steps = 800
    c.eval_every = 400
  if which in ("target_gpu", "draft_gpu"):  # launch/train_pair_gpu.sh: the whole pair on one lent GPU.
    c.tokenizer = "jaxspec/embedded/ende-target"  # The shipped tokenizer: same ids as the CPU-trained pair.
    c.train = ".gpu/data/train.tsv.gz"
    c.dev = ".gpu/data/dev.tsv"
    c.tokens_per_batch = 16384
    c.log_every = 100
    c.checkpoint_every = 200
    c.export_best = True
  if which == "target_gpu":
    # ~29M parameters: a decoder (~16M without the embedding) well beyond the 32 MB L3 cache in float32, which
    # brings the CPU's verify-cost ratio r towards 1.5; 59 MB in bfloat16, so the pair stays under 80 MB.
    c.model = dict(d_model=512, d_kv=64, d_ff=1280, num_layers=3, num_decoder_layers=4, num_heads=8,
                   activation="gelu_new", gated=True, tie_word_embeddings=True, scale_decoder_outputs=True)
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
  return c
