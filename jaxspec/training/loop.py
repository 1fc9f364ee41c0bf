"""`train_and_evaluate(config, workdir)`: the EN-DE training loop (configs/ende.py), resumable, with evaluation
and export, as the flax examples' train.py; launch/train.py, jaxspec/training/ende_pair.py (the v2 pair; launch/train_pair_v2.py) and notebooks call it.

A killed run started again with the same workdir continues from its latest Orbax checkpoint (WORKDIR/checkpoints),
at the same place in the data. Progress: a tqdm bar (steps, rate, ETA) and a line every `log_every` steps (steps/s,
tokens/s, loss, gradient norm, ETA); every `eval_every` steps the dev loss (overall and per domain), the share of
dev tokens the model ranks first, and greedy dev BLEU. The final model (with its tokenizer) is written to
WORKDIR/export in Orbax format; with `export_best`, the model of the evaluation with the lowest dev loss instead
(WORKDIR/export_meta.json says which step).

With `time_budget_s`, training stops when that many seconds have passed since the call (setup included), the
learning rate decays by the fraction of the budget spent (`steps.budget_lr_scale`), and the best model is
held in device memory and exported once at the end (no export per improvement).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import jaxspec
from jaxspec.training import steps
from jaxspec.tools.batching import generate_all
from jaxspec.checkpoint import embedded_names
from jaxspec.data.ende import (DISTILLED, Pair, bucket_of, bucketed_batches, evenly_spaced, length_buckets, read_pairs,
                               read_splits, split_path)
from jaxspec.data.token_cache import cache_key, tokenize, tokenized_pairs
from jaxspec.models import t5
from jaxspec.tools.outputs import atomic_write_json, progress
from jaxspec.tokenizer import load_tokenizer
from jaxspec.errors import ConfigError


def tokenizer_dir(spec: str) -> str:
  """A tokenizer directory, or an embedded model's name (its directory holds the tokenizer)."""
  if os.path.isdir(spec):
    return spec
  if spec in embedded_names():
    return os.path.join(os.path.dirname(jaxspec.__file__), "embedded", spec)
  raise ConfigError(f"config.tokenizer={spec!r}: not a directory nor an embedded model name "
                    "(launch/train_tokenizer.py writes a tokenizer directory).")


class _PastDeadline(Exception):
  pass


def distill(target, pairs: list[Pair], *, batch_size: int, max_len: int, deadline: float = float("inf"),
            start: int = 0, on_rows=None) -> list[Pair]:
  """Sequence-level distillation data: the target's greedy translations of the pairs' English.

  Sources longer than max_len tokens are left out; the rest go in length-sorted batches (little padding; the
  order is deterministic, so `start` resumes a run that wrote its first `start` rows). Stops after the batch
  that ends past `deadline` (a time.time() value). Returns the new pairs (German: the target's output, source:
  DISTILLED + the original source), also passed to on_rows(pairs) batch by batch.
  """
  if not pairs:
    return []
  ids = tokenize(target.tokenizer, (p.en for p in pairs))
  order = sorted((i for i in range(len(pairs)) if len(ids[i]) <= max_len), key=lambda i: len(ids[i]))
  clean = lambda text: " ".join(text.replace("\t", " ").split())
  out = []

  def on_batch(idx: list[int], texts: list[str]) -> None:
    rows = [Pair(clean(pairs[order[i]].en), clean(t) or ".", DISTILLED + pairs[order[i]].source)
            for i, t in zip(idx, texts)]
    out.extend(rows)
    if on_rows is not None:
      on_rows(rows)
    if time.time() >= deadline:
      raise _PastDeadline

  try:
    generate_all(target, [ids[i] for i in order], batch_size=batch_size, max_new_tokens=max_len,
                 max_input_length=max_len, start=start, on_batch=on_batch, desc="distill")
  except _PastDeadline:
    print(f"distillation stopped at its deadline after {len(out)} of {len(order) - start} sources", flush=True)
  return out


def _dev_bleu(model, dev_pairs) -> tuple[float, list[str]]:
  import sacrebleu
  ids = [model.tokenizer.encode(p.en) for p in dev_pairs]
  run = generate_all(model, ids, batch_size=32, max_new_tokens=64, bar=False)
  hyps = [run.texts[i] for i in range(len(dev_pairs))]
  return sacrebleu.corpus_bleu(hyps, [[p.de for p in dev_pairs]]).score, hyps


def _best_dev_loss(workdir: str) -> float:
  """Dev loss of the model in WORKDIR/export (inf if none): with export_best, a better evaluation replaces it."""
  path = os.path.join(workdir, "export_meta.json")
  if not os.path.exists(path):
    return float("inf")
  with open(path, encoding="utf-8") as f:
    return json.load(f).get("dev_loss", float("inf"))


def _export(model, workdir: str, meta: dict, log) -> None:
  path = os.path.join(workdir, "export")
  jaxspec.save(model, path, format="orbax")
  atomic_write_json(os.path.join(workdir, "export_meta.json"), meta)
  log(f"exported to {path} ({meta})")


def _setup(c, workdir: str, on_ready=None):
  """Tokenizer, teacher, data (natural pairs repeated) and dev pairs; ConfigError for what the config gets wrong.

  on_ready(tokenizer, teacher), if given, is called before the training data is tokenized (the train programs
  start compiling there)."""
  if c.train is None:
    raise ConfigError("config.train is not set: this config trains on launch/distill_corpus.py's output; pass "
                      "--config.train=PATH.")
  train = split_path(c.train or "train", c.data_dir)
  dev = read_splits(c.dev or "dev", c.data_dir)
  tokenizer = load_tokenizer(tokenizer_dir(c.tokenizer))
  if tokenizer is None:
    raise ConfigError(f"no tokenizer in {c.tokenizer}: run launch/train_tokenizer.py first.")
  if c.distill_weight > 0 and not c.teacher:
    raise ConfigError(f"config.distill_weight={c.distill_weight} needs config.teacher (a model directory or name).")
  if c.compute_dtype not in ("float32", "bfloat16"):
    raise ConfigError(f"config.compute_dtype={c.compute_dtype!r}: expected 'float32' or 'bfloat16'.")
  teacher = jaxspec.load(c.teacher, dtype=jnp.float32) if c.teacher else None
  if teacher is not None and not teacher.tokenizer.same_as(tokenizer):
    raise ConfigError(f"the teacher's tokenizer ({c.teacher}) differs from config.tokenizer ({c.tokenizer}).")
  if on_ready is not None:
    on_ready(tokenizer, teacher)
  src, tgt = tokenized_pairs(train, tokenizer, os.path.join(workdir, "train_tokens.json"))
  if c.natural_repeat > 1:  # Natural sentences are few: seen natural_repeat times per epoch.
    natural = [i for i, p in enumerate(read_pairs(train)) if p.is_natural] * (c.natural_repeat - 1)
    src, tgt = src + [src[i] for i in natural], tgt + [tgt[i] for i in natural]
  data_key = hashlib.sha256(json.dumps(cache_key(train, tokenizer), sort_keys=True).encode()).hexdigest()[:16]
  return tokenizer, teacher, src, tgt, dev, data_key


def _buckets(c) -> list[int]:
  try:
    return length_buckets(c.max_len, spec=c.length_buckets)
  except ValueError as e:
    raise ConfigError(f"config.length_buckets={c.length_buckets!r}: expected comma-separated integers.") from e


def prepare_programs(c, vocab_size: int, teacher_config: t5.T5Config | None = None,
                     after: steps.TrainPrograms | None = None) -> steps.TrainPrograms:
  """The train programs of config `c` (one per length bucket), not started: `.start()` compiles them in a thread.

  Only shapes are needed: the model's from c.model and vocab_size, the teacher's from teacher_config (a
  distillation run: its parameters are cast to c.compute_dtype). `train_and_evaluate(c, ..., programs=...)` then
  trains with them (training/ende_pair.py compiles the draft's while the target trains)."""
  cfg = t5.T5Config(vocab_size=vocab_size, **c.model)
  optimizer = steps.make_optimizer(c.learning_rate, c.warmup_steps, None if c.time_budget_s > 0 else c.train_steps,
                                   c.weight_decay)
  settings = steps.StepConfig(model=cfg, teacher=teacher_config, distill_weight=c.distill_weight,
                              dropout_rate=c.dropout_rate, label_smoothing=c.label_smoothing,
                              compute_dtype=c.compute_dtype, seed=c.seed)
  params = jax.eval_shape(lambda: t5.init_params(cfg, jax.random.key(0)))
  teacher = None
  if teacher_config is not None:
    teacher = jax.eval_shape(lambda: steps.cast(t5.init_params(teacher_config, jax.random.key(0)), c.compute_dtype))
  return steps.TrainPrograms(settings, optimizer, params, teacher, steps.batch_shapes(c.tokens_per_batch, _buckets(c)),
                             after=after)


def _compile_eval(cfg, params, tokenizer, dev_pairs, c, timings: dict):
  """Compiles `steps.eval_step` for the dev batches' shape in a thread (a call on zeros fills jit's cache, which
  `steps.dev_metrics` then hits); its seconds go to timings["eval_compile_s"]. Returns the thread."""
  import threading
  width = steps.dev_width(tokenizer, dev_pairs, c.max_len)

  def run():
    t = time.time()
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), params)
    batch = jnp.zeros((steps.DEV_ROWS, width), jnp.int32)
    jax.block_until_ready(steps.eval_step(cfg, zeros, batch, batch, c.compute_dtype))
    timings["eval_compile_s"] = round(time.time() - t, 2)

  thread = threading.Thread(target=run, name="eval-compile", daemon=True)
  thread.start()
  return thread


def _same_shapes(a, b) -> bool:
  flat = lambda t: (jax.tree.structure(t), [(x.shape, jnp.dtype(x.dtype)) for x in jax.tree.leaves(t)])
  return flat(a) == flat(b)


def train_and_evaluate(c, workdir: str, programs: steps.TrainPrograms | None = None) -> dict:
  """Trains per config `c` (configs/ende.py) in `workdir`; returns the last evaluation's metrics, with
  "timings": the seconds of each stage (setup, tokenize, each train program's compile and the wait for it,
  steps, evaluations), steps/s and tokens/s (real tokens, both sides) over the steps' time, the number of
  compiled train programs, and the share of the call's time spent in steps.

  The train programs (one per length bucket: `prepare_programs`) start compiling in a thread before the corpus
  is tokenized; `programs` (prepared and maybe compiled already) are used when their shapes match."""
  t_enter = time.time()
  os.makedirs(workdir, exist_ok=True)
  buckets, timings, ready = _buckets(c), {}, {}

  def on_ready(tokenizer, teacher):  # Before tokenizing: compile meanwhile.
    timings["setup_s"] = round(time.time() - t_enter, 2)
    ready["t"] = time.time()
    ready["programs"] = programs
    if programs is None or programs.settings.model != t5.T5Config(vocab_size=tokenizer.vocab_size, **c.model) or (
        programs.settings.teacher != (teacher.config if teacher else None)):
      ready["programs"] = prepare_programs(c, tokenizer.vocab_size, teacher.config if teacher else None)
    if ready["programs"]._thread is None:
      ready["programs"].start()

  tokenizer, teacher, src, tgt, dev_all, data_key = _setup(c, workdir, on_ready=on_ready)
  timings["tokenize_s"] = round(time.time() - ready["t"], 2)
  programs = ready["programs"]
  used = {bucket_of(max(len(s), len(t)), buckets) for s, t in zip(src, tgt)}  # Buckets without pairs: no program.
  programs.keep_only([s for s in programs.planned if s[1] in used])
  cfg, optimizer = programs.settings.model, programs.optimizer
  dev_natural = [p for p in dev_all if p.is_natural][:c.dev_bleu_sentences]
  dev_loss_pairs = evenly_spaced(dev_all, c.dev_loss_pairs)
  eval_compile = _compile_eval(cfg, programs.params, tokenizer, dev_loss_pairs, c, timings)
  budgeted = c.time_budget_s > 0
  params = t5.init_params(cfg, jax.random.key(c.seed))
  if c.init_from:  # Continue from a saved model (e.g. an embedded one), with a fresh optimizer state.
    start = jaxspec.load(c.init_from, dtype=jnp.float32)
    if start.config != cfg:
      raise ConfigError(f"config.init_from={c.init_from} has config {start.config}, not {cfg}.")
    params = start.params
  opt_state = optimizer.init(params)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  print(f"model {n_params / 1e6:.2f}M params; {len(src)} training pairs; devices {jax.devices()}", flush=True)

  manager = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")),
                                  options=ocp.CheckpointManagerOptions(max_to_keep=2))
  step, epoch, batch_in_epoch = 0, 0, 0
  if manager.latest_step() is not None:
    restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
        state=ocp.args.StandardRestore({"params": params, "opt_state": opt_state}), meta=ocp.args.JsonRestore()))
    params, opt_state = restored.state["params"], restored.state["opt_state"]
    step, epoch, batch_in_epoch = (restored.meta[k] for k in ("step", "epoch", "batch_in_epoch"))
    print(f"resumed from step {step} (epoch {epoch}, batch {batch_in_epoch})", flush=True)
    if restored.meta.get("data", data_key) != data_key:  # Its place in the data means nothing in other data.
      print("the training data or tokenizer changed since that checkpoint: continuing with a new epoch", flush=True)
      epoch, batch_in_epoch = epoch + 1, 0

  teacher_params = steps.cast(teacher.params, c.compute_dtype) if teacher else None
  if not (_same_shapes(params, programs.params) and (teacher_params is None) == (programs.teacher is None)
          and (teacher_params is None or _same_shapes(teacher_params, programs.teacher))):
    print("the prepared train programs do not fit these parameters: compiling new ones", flush=True)
    programs = prepare_programs(c, tokenizer.vocab_size, teacher.config if teacher else None).start()
  epoch_batches = lambda e: bucketed_batches(src, tgt, c.tokens_per_batch, c.max_len,
                                             np.random.RandomState(c.seed * 1000 + e), buckets=buckets)
  batches = epoch_batches(epoch)
  for _ in range(batch_in_epoch):
    next(batches, None)
  bar = progress(c.train_steps, "train", unit="step", initial=step)

  def log(line: str) -> None:
    bar.write(line, file=sys.stdout)
    sys.stdout.flush()

  t_last, tokens_since, losses, metrics = time.time(), 0.0, [], {}
  t_start, start_step, best, best_loss = time.time(), step, None, _best_dev_loss(workdir)
  deadline = t_enter + c.time_budget_s if budgeted else float("inf")
  last_eval, last_saved, stop = -1, step, False
  eval_s = checkpoint_s = tokens_total = 0.0
  wait_before, steps_done = programs.wait_s, step
  while not stop:
    stop = step >= c.train_steps or time.time() >= deadline
    if not stop:
      try:
        inputs, labels = next(batches)
      except StopIteration:
        epoch, batch_in_epoch = epoch + 1, 0
        batches = epoch_batches(epoch)
        continue
      lr_scale = steps.budget_lr_scale((time.time() - t_start) / max(deadline - t_start, 1e-9)) if budgeted else 1.0
      params, opt_state, m = programs.step(params, opt_state, inputs, labels, teacher_params, step, lr_scale)
      step, batch_in_epoch = step + 1, batch_in_epoch + 1
      tokens_since += float((labels != 0).sum() + (inputs != 0).sum())
      tokens_total += float((labels != 0).sum() + (inputs != 0).sum())
      losses.append(m)
      bar.update(1)
    if losses and (step % c.log_every == 0 or stop):
      m = jax.device_get(losses)  # Also bounds how far the host runs ahead of the device.
      now = time.time()
      eta = max(min((c.train_steps - step) * (now - t_start) / max(step - start_step, 1), deadline - now), 0)
      extra = f" kl {np.mean([x['kl'] for x in m]):.3f}" if "kl" in m[0] else ""
      log(f"step {step}/{c.train_steps} epoch {epoch} | {len(m) / (now - t_last):.2f} steps/s "
          f"{tokens_since / (now - t_last):.0f} tok/s | ce {np.mean([x['ce'] for x in m]):.3f}{extra} | grad "
          f"{np.mean([x['grad_norm'] for x in m]):.2f} | ETA {eta / 60:.1f} min")
      t_last, tokens_since, losses = now, 0.0, []
    if c.checkpoint_every and step != last_saved and (step % c.checkpoint_every == 0 or stop):
      jax.block_until_ready(params)  # The steps before count as steps, not as checkpointing.
      t_checkpoint = time.time()
      last_saved = step
      manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
          meta=ocp.args.JsonSave({"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "data": data_key})))
      checkpoint_s += time.time() - t_checkpoint
    if (step % c.eval_every == 0 or stop) and step != last_eval:
      jax.block_until_ready(params)  # The steps before count as steps, not as evaluation.
      t_eval = time.time()
      eval_compile.join()
      last_eval = step
      model = jaxspec.Model(cfg, params, tokenizer)
      dev = steps.dev_metrics(cfg, params, tokenizer, dev_loss_pairs, c.max_len, c.compute_dtype)
      metrics = {"step": step, "dev_loss": dev["loss"], **{f"dev_{k}": v for k, v in dev.items() if k != "loss"}}
      domains = ", ".join(f"{k[5:]} {v:.3f}" for k, v in dev.items() if k.startswith("loss_"))
      line = f"eval step {step}: dev loss {dev['loss']:.3f} ({domains}) | top-1 {dev['acc']:.3f}"
      if dev_natural:
        metrics["dev_bleu"], hyps = _dev_bleu(model, dev_natural)
        line += (f" | dev BLEU {metrics['dev_bleu']:.2f} (greedy, {len(dev_natural)} natural sentences) | e.g. "
                 f"{dev_natural[0].en!r} -> {hyps[0]!r}")
      log(line)
      if c.export_best and dev["loss"] < best_loss:
        best_loss = dev["loss"]
        if budgeted:
          best = (jax.tree.map(jnp.copy, params), metrics)  # params are donated to the next step: a copy.
        else:
          _export(model, workdir, metrics, log)
      eval_s += time.time() - t_eval
  loop_s = time.time() - t_start
  bar.close()
  manager.wait_until_finished()
  if step < c.train_steps:
    print(f"stopped by the time budget ({c.time_budget_s:.0f} s) at step {step}, "
          f"{time.time() - t_enter:.0f} s after the start", flush=True)
  t_export = time.time()
  if best is not None:
    _export(jaxspec.Model(cfg, best[0], tokenizer), workdir, best[1], print)
  elif not c.export_best:
    _export(jaxspec.Model(cfg, params, tokenizer), workdir, {"step": step}, print)
  wait_s = programs.wait_s - wait_before
  steps_s = max(loop_s - eval_s - checkpoint_s - wait_s, 1e-9)
  total = time.time() - t_enter
  timings.update(compile_s=dict(programs.seconds), compile_wait_s=round(wait_s, 2), train_programs=programs.count,
                 steps=step - steps_done, steps_s=round(steps_s, 4), eval_s=round(eval_s, 2),
                 checkpoint_s=round(checkpoint_s, 2), export_s=round(time.time() - t_export, 2),
                 steps_per_s=round((step - steps_done) / steps_s, 3), tokens_per_s=round(tokens_total / steps_s, 1),
                 total_s=round(total, 2), step_share=round(steps_s / total, 3))
  print(f"timings: {json.dumps(timings)}", flush=True)
  return {**metrics, "timings": timings}
