r"""Trains a T5 on EN-DE pairs with optax; resumable from Orbax checkpoints.

    python launch/train.py --config=configs/ende.py:target --workdir=/tmp/work/target
    python launch/train.py --config=configs/ende.py:draft --workdir=/tmp/work/draft   # distils from the target

A killed run started again with the same --workdir continues from its latest checkpoint, at the same place in
the data. Progress lines give steps/s, tokens/s, loss and ETA; evaluations give dev loss and BLEU. The final
model (with its tokenizer) is written to WORKDIR/export in Orbax format, loadable with `jaxspec.load`; with
`--config.export_best=true`, the model of the evaluation with the lowest dev loss instead (WORKDIR/export_meta.json
says which step).
"""

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import app, flags, logging
from ml_collections import config_flags

import jaxspec
from jaxspec import training
from jaxspec.data.ende import bucketed_batches, read_pairs
from jaxspec.models import t5
from jaxspec.tokenizer import load_tokenizer

_CONFIG = config_flags.DEFINE_config_file("config", "configs/ende.py:target", "Training settings.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/work/target", "Checkpoints, logs and the exported model.")


def _tokenize(tokenizer, texts):
  return [list(ids) for ids in tokenizer.hf_tokenizer(list(texts))["input_ids"]]


def _load_data(c, tokenizer, workdir):
  cache = os.path.join(workdir, "train_tokens.json")
  if os.path.exists(cache):
    with open(cache) as f:
      data = json.load(f)
    return data["src"], data["tgt"]
  pairs = read_pairs(c.train)
  src, tgt = _tokenize(tokenizer, (p.en for p in pairs)), _tokenize(tokenizer, (p.de for p in pairs))
  with open(cache, "w") as f:
    json.dump({"src": src, "tgt": tgt}, f)
  return src, tgt


def _epoch_batches(c, src, tgt, epoch):
  return bucketed_batches(src, tgt, c.tokens_per_batch, c.max_len, np.random.RandomState(c.seed * 1000 + epoch))


def _dev_loss(cfg, params, tokenizer, dev_pairs, max_len):
  src, tgt = _tokenize(tokenizer, (p.en for p in dev_pairs)), _tokenize(tokenizer, (p.de for p in dev_pairs))
  total, count = 0.0, 0.0
  for inputs, labels in bucketed_batches(src, tgt, 4096, max_len, np.random.RandomState(0)):
    s, n = training.eval_step(cfg, params, inputs, labels)
    total, count = total + float(s), count + float(n)
  return total / max(count, 1)


def _dev_bleu(model, dev_pairs, batch=32):
  import sacrebleu
  hyps = []
  for k in range(0, len(dev_pairs), batch):
    chunk = dev_pairs[k:k + batch]
    chunk = chunk + [chunk[-1]] * (batch - len(chunk))  # fixed batch size: one compilation
    out = jaxspec.generate(model, [p.en for p in chunk], max_new_tokens=64)
    hyps += out.texts[:len(dev_pairs) - k]
  return sacrebleu.corpus_bleu(hyps, [[p.de for p in dev_pairs]]).score, hyps


def main(argv):
  del argv
  c, workdir = _CONFIG.value, _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  logging.info("JAX devices: %s", jax.devices())
  tokenizer = load_tokenizer(c.tokenizer)
  if tokenizer is None:
    raise SystemExit(f"no tokenizer in {c.tokenizer}: run launch/train_tokenizer.py first.")
  cfg = t5.T5Config(vocab_size=tokenizer.vocab_size, **c.model)
  teacher = jaxspec.load(c.teacher, dtype=jnp.float32) if c.teacher else None
  if teacher is not None and not teacher.tokenizer.same_as(tokenizer):
    raise SystemExit("the teacher's tokenizer differs from the student's.")
  src, tgt = _load_data(c, tokenizer, workdir)
  dev_all = read_pairs(c.dev)
  dev_natural = [p for p in dev_all if p.is_natural][:c.dev_bleu_sentences]
  dev_loss_pairs = dev_all[:c.dev_loss_pairs]

  optimizer = training.make_optimizer(c.learning_rate, c.warmup_steps, c.train_steps, c.weight_decay)
  params = t5.init_params(cfg, jax.random.key(c.seed))
  if c.init_from:  # Continue from a saved model (e.g. an embedded one), with a fresh optimizer state.
    start = jaxspec.load(c.init_from, dtype=jnp.float32)
    if start.config != cfg:
      raise SystemExit(f"--config.init_from={c.init_from} has config {start.config}, not {cfg}.")
    params = start.params
  opt_state = optimizer.init(params)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  logging.info("model: %s, %.2fM params", cfg, n_params / 1e6)
  print(f"model {n_params / 1e6:.2f}M params; {len(src)} training pairs", flush=True)

  manager = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")),
                                  options=ocp.CheckpointManagerOptions(max_to_keep=2))
  step, epoch, batch_in_epoch = 0, 0, 0
  if manager.latest_step() is not None:
    restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
        state=ocp.args.StandardRestore({"params": params, "opt_state": opt_state}),
        meta=ocp.args.JsonRestore()))
    params, opt_state = restored.state["params"], restored.state["opt_state"]
    step, epoch, batch_in_epoch = (restored.meta[k] for k in ("step", "epoch", "batch_in_epoch"))
    print(f"resumed from step {step} (epoch {epoch}, batch {batch_in_epoch})", flush=True)

  settings = training.StepConfig(model=cfg, teacher=teacher.config if teacher else None,
                                 distill_weight=c.distill_weight)
  teacher_params = teacher.params if teacher else None
  batches = _epoch_batches(c, src, tgt, epoch)
  for _ in range(batch_in_epoch):
    next(batches)
  t_last, tokens_since, losses = time.time(), 0.0, []
  t_start, start_step = time.time(), step
  while step < c.train_steps:
    try:
      inputs, labels = next(batches)
    except StopIteration:
      epoch, batch_in_epoch = epoch + 1, 0
      batches = _epoch_batches(c, src, tgt, epoch)
      continue
    params, opt_state, metrics = training.train_step(settings, optimizer, params, opt_state, inputs, labels,
                                                     teacher_params)
    step, batch_in_epoch = step + 1, batch_in_epoch + 1
    tokens_since += float((labels != 0).sum() + (inputs != 0).sum())
    losses.append(metrics)
    if step % c.log_every == 0:
      m = jax.device_get(losses)
      now = time.time()
      rate = c.log_every / (now - t_last)
      eta = (c.train_steps - step) * (now - t_start) / max(step - start_step, 1)
      extra = f" kl {np.mean([x['kl'] for x in m]):.3f}" if "kl" in m[0] else ""
      print(f"step {step}/{c.train_steps} epoch {epoch} | {rate:.2f} steps/s {tokens_since / (now - t_last):.0f} "
            f"tok/s | ce {np.mean([x['ce'] for x in m]):.3f}{extra} | grad {np.mean([x['grad_norm'] for x in m]):.2f}"
            f" | ETA {eta / 60:.1f} min", flush=True)
      t_last, tokens_since, losses = now, 0.0, []
    if step % c.checkpoint_every == 0 or step == c.train_steps:
      manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
          meta=ocp.args.JsonSave({"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch})))
    if step % c.eval_every == 0 or step == c.train_steps:
      model = jaxspec.Model(cfg, params, tokenizer)
      loss = _dev_loss(cfg, params, tokenizer, dev_loss_pairs, c.max_len)
      bleu, hyps = _dev_bleu(model, dev_natural)
      print(f"eval step {step}: dev loss {loss:.3f} | dev BLEU {bleu:.2f} (greedy, {len(dev_natural)} natural "
            f"sentences) | e.g. {dev_natural[0].en!r} -> {hyps[0]!r}", flush=True)
      if c.export_best and loss < _best_dev_loss(workdir):
        _export(model, workdir, {"step": step, "dev_loss": loss, "dev_bleu": bleu})
  manager.wait_until_finished()
  if not c.export_best:
    _export(jaxspec.Model(cfg, params, tokenizer), workdir, {"step": step})


def _best_dev_loss(workdir: str) -> float:
  """Dev loss of the model in WORKDIR/export (inf if none): with export_best, a better evaluation replaces it."""
  path = os.path.join(workdir, "export_meta.json")
  if not os.path.exists(path):
    return float("inf")
  with open(path) as f:
    return json.load(f).get("dev_loss", float("inf"))


def _export(model, workdir: str, meta: dict) -> None:
  path = os.path.join(workdir, "export")
  jaxspec.save(model, path, format="orbax")
  with open(os.path.join(workdir, "export_meta.json"), "w") as f:
    json.dump(meta, f)
  print(f"exported to {path} ({meta})", flush=True)


if __name__ == "__main__":
  app.run(main)
