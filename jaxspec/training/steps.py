"""Training T5 pairs with optax: teacher-forced cross-entropy, token-level distillation, resumable state.

Regularisation for training only: dropout (`t5.forward`'s dropout rng, a fresh mask every step) and label
smoothing. Mixed precision: with `StepConfig.compute_dtype` "bfloat16" the float32 parameters are cast for the
forward and backward passes (gradients and optimizer state stay float32; logits and losses are float32).
Evaluation: `dev_metrics`, the dev loss and top-1 agreement per domain in one compiled shape.

Shapes: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxspec.data.ende import length_buckets, pad_rows
from jaxspec.data.token_cache import tokenize
from jaxspec.models import t5


def shift_right(labels: jax.Array, start_id: int) -> jax.Array:
  """Decoder inputs for teacher forcing: [start, y_1, ..., y_{T-1}]. labels: [B, T]."""
  return jnp.concatenate([jnp.full_like(labels[:, :1], start_id), labels[:, :-1]], axis=1)


def token_losses(logits: jax.Array, labels: jax.Array, pad_id: int) -> tuple[jax.Array, jax.Array]:
  """Per-token cross-entropy [B, T] and the mask of real label tokens [B, T] (EOS counts, padding does not)."""
  mask = (labels != pad_id).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels) * mask, mask


def cast(params: dict, dtype: str) -> dict:
  """The floating-point parameters in `dtype` ("float32" leaves them as they are)."""
  if dtype == "float32":
    return params
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def loss_fn(params: dict, cfg: t5.T5Config, inputs: jax.Array, labels: jax.Array,
            teacher_logits: jax.Array | None = None, distill_weight: float = 0.0, *, label_smoothing: float = 0.0,
            dropout_rate: float = 0.0, dropout_rng: jax.Array | None = None) -> tuple[jax.Array, dict]:
  """Mean token cross-entropy (label-smoothed), mixed with KL(teacher || student) when teacher logits [B, T, V]
  are given. metrics["ce"] is the plain cross-entropy, whatever the smoothing."""
  logits = t5.forward(params, cfg, inputs, shift_right(labels, cfg.decoder_start_token_id),
                      dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  ce, mask = token_losses(logits, labels, cfg.pad_token_id)
  n = jnp.maximum(mask.sum(), 1.0)
  metrics = {"ce": ce.sum() / n, "tokens": mask.sum()}
  loss = metrics["ce"]
  if label_smoothing > 0:  # (1 - eps) * CE + eps * CE against the uniform distribution.
    uniform = -jnp.mean(jax.nn.log_softmax(logits), axis=-1) * mask
    loss = (1 - label_smoothing) * loss + label_smoothing * uniform.sum() / n
  if teacher_logits is not None:
    teacher = jax.nn.log_softmax(teacher_logits)
    kl = jnp.sum(jnp.exp(teacher) * (teacher - jax.nn.log_softmax(logits)), axis=-1) * mask
    metrics["kl"] = kl.sum() / n
    loss = (1 - distill_weight) * loss + distill_weight * metrics["kl"]
  return loss, metrics


def make_optimizer(learning_rate: float, warmup_steps: int, total_steps: int | None, weight_decay: float = 0.0,
                   clip: float = 1.0) -> optax.GradientTransformation:
  """AdamW with linear warm-up and cosine decay to 5% at total_steps, gradient clipping by global norm.

  total_steps None: constant after the warm-up (a time-budgeted run decays the rate with `budget_lr_scale`).
  """
  if total_steps is None:
    schedule = optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1))
  else:
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps,
                                                  max(total_steps, warmup_steps + 1), end_value=learning_rate * 0.05)
  return optax.chain(optax.clip_by_global_norm(clip), optax.adamw(schedule, b2=0.98, weight_decay=weight_decay))


def budget_lr_scale(fraction: float) -> float:
  """Cosine decay from 1 to 0.05 over the fraction [0, 1] of a time budget that has passed."""
  fraction = min(max(fraction, 0.0), 1.0)
  return 0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * fraction))


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Static settings of the train step."""

  model: t5.T5Config
  teacher: t5.T5Config | None = None
  distill_weight: float = 0.0
  dropout_rate: float = 0.0  # Training-time dropout (model.Dropout); 0 = none.
  label_smoothing: float = 0.0
  compute_dtype: str = "float32"  # "bfloat16": mixed precision (float32 parameters and optimizer state).
  seed: int = 0  # Dropout masks: key(seed) folded with the step number.


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 3))
def train_step(settings: StepConfig, optimizer: optax.GradientTransformation, params, opt_state, inputs, labels,
               teacher_params=None, step=0, lr_scale=1.0):
  """One optimizer step; the update is multiplied by lr_scale (a time budget's decay). teacher_params are
  expected in the compute dtype already. Returns (params, opt_state, metrics)."""
  teacher_logits = None
  if settings.teacher is not None:
    teacher_logits = jax.lax.stop_gradient(t5.forward(
        teacher_params, settings.teacher, inputs, shift_right(labels, settings.teacher.decoder_start_token_id)))
  rng = jax.random.fold_in(jax.random.key(settings.seed), step) if settings.dropout_rate > 0 else None
  grad_fn = jax.grad(lambda p: loss_fn(cast(p, settings.compute_dtype), settings.model, inputs, labels,
                                       teacher_logits, settings.distill_weight,
                                       label_smoothing=settings.label_smoothing,
                                       dropout_rate=settings.dropout_rate, dropout_rng=rng), has_aux=True)
  grads, metrics = grad_fn(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  updates = jax.tree.map(lambda u: u * lr_scale, updates)
  metrics["grad_norm"] = optax.global_norm(grads)
  return optax.apply_updates(params, updates), opt_state, metrics


@functools.partial(jax.jit, static_argnums=(0, 4))
def eval_step(cfg: t5.T5Config, params, inputs, labels, compute_dtype: str = "float32"):
  """Summed cross-entropy [B], token count [B] and argmax hits [B] per row of one batch (no dropout).

  Hits count the label tokens the model ranks first: against a target's own greedy output, their share is what
  a greedy draft gets accepted (alpha at temperature 0) when the target decodes that output."""
  logits = t5.forward(cast(params, compute_dtype), cfg, inputs, shift_right(labels, cfg.decoder_start_token_id))
  ce, mask = token_losses(logits, labels, cfg.pad_token_id)
  hits = (jnp.argmax(logits, axis=-1) == labels) * mask
  return ce.sum(axis=1), mask.sum(axis=1), hits.sum(axis=1)


DEV_ROWS = 128  # Rows per evaluation batch.


def dev_width(tokenizer, dev_pairs, max_len: int) -> int:
  """The padded length of `dev_metrics`' batches for these pairs: the bucket of the longest side (<= max_len)."""
  src, tgt = tokenize(tokenizer, (p.en for p in dev_pairs)), tokenize(tokenizer, (p.de for p in dev_pairs))
  return next(b for b in length_buckets(max_len) if b >= min(max_len, max(map(len, src + tgt))))


def dev_metrics(cfg, params, tokenizer, dev_pairs, max_len: int, compute_dtype: str = "float32",
                rows: int = DEV_ROWS) -> dict:
  """Dev loss (nats per token) and argmax accuracy, overall and per domain ("loss_natural", "acc_natural", ...).

  All pairs are padded to one shape ([rows, `dev_width`]), so evaluation compiles once."""
  src, tgt = tokenize(tokenizer, (p.en for p in dev_pairs)), tokenize(tokenizer, (p.de for p in dev_pairs))
  width = dev_width(tokenizer, dev_pairs, max_len)
  sums, pad = [], cfg.pad_token_id
  for k in range(0, len(src), rows):
    inputs, labels = pad_rows(src[k:k + rows], width, pad, rows), pad_rows(tgt[k:k + rows], width, pad, rows)
    sums.append(np.stack(jax.device_get(eval_step(cfg, params, inputs, labels, compute_dtype)), 1))
  ce, count, hits = np.concatenate(sums)[:len(dev_pairs)].T
  out = {}
  for name, keep in [("", np.ones(len(dev_pairs), bool))] + [
      ("_" + d, np.array([p.domain == d for p in dev_pairs])) for d in sorted({p.domain for p in dev_pairs})]:
    out["loss" + name] = float(ce[keep].sum() / max(count[keep].sum(), 1))
    out["acc" + name] = float(hits[keep].sum() / max(count[keep].sum(), 1))
  return out


def _shapes(tree):
  """ShapeDtypeStructs of a pytree of arrays (or of ShapeDtypeStructs)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


class TrainPrograms:
  """`train_step` compiled ahead of time (AOT: `.lower(...).compile()`) for each batch shape, in a background
  thread, so that compilation overlaps what comes before training (tokenizing the corpus, another model's
  training). One program per (rows, length) batch shape: with two length buckets, two programs.

      programs = TrainPrograms(settings, optimizer, params, teacher_params, shapes=[(512, 32), (170, 96)])
      programs.start()                       # returns at once; compiles in order in a thread
      ...                                    # tokenize
      params, opt_state, m = programs.step(params, opt_state, inputs, labels, teacher_params, step, lr_scale)

  `step` waits for its shape's program (the wait is added to `wait_s`); a shape not planned is compiled on the
  spot (and counted). `seconds` maps each program's name ("train_step[512x32]") to its compile seconds; a jitted
  call would not reuse these programs (jit keeps its own cache), so every step goes through `step`.

  Args:
    params, teacher_params: the arrays or only their shapes (ShapeDtypeStructs; `jax.eval_shape` gives them);
      teacher_params in the compute dtype, None without a teacher.
    after: another TrainPrograms whose compilation must end first (one compile at a time on the host).
  """

  def __init__(self, settings: StepConfig, optimizer: optax.GradientTransformation, params, teacher_params=None,
               shapes=(), after: "TrainPrograms | None" = None):
    import threading
    self.settings, self.optimizer, self.after = settings, optimizer, after
    self.params = _shapes(params)
    self.opt_state = jax.eval_shape(optimizer.init, self.params)
    self.teacher = None if teacher_params is None else _shapes(teacher_params)
    self.planned = [tuple(int(v) for v in s) for s in shapes]
    self.programs, self.seconds, self.wait_s, self.error = {}, {}, 0.0, None
    self._lock, self._done, self._thread = threading.Lock(), threading.Event(), None

  @staticmethod
  def name(rows: int, length: int) -> str:
    return f"train_step[{rows}x{length}]"

  def _compile(self, rows: int, length: int):
    import time
    batch = jax.ShapeDtypeStruct((rows, length), jnp.int32)
    t = time.time()
    program = train_step.lower(self.settings, self.optimizer, self.params, self.opt_state, batch, batch,
                               self.teacher, jax.ShapeDtypeStruct((), jnp.int32),
                               jax.ShapeDtypeStruct((), jnp.float32)).compile()
    with self._lock:
      self.programs[(rows, length)] = program
      self.seconds[self.name(rows, length)] = round(time.time() - t, 2)
    return program

  def _run(self):
    try:
      if self.after is not None:
        self.after._done.wait()  # Not `wait()`: that time is the other's callers' to count.
      for shape in list(self.planned):
        if shape in self.planned and shape not in self.programs:  # `keep_only` may have dropped it meanwhile.
          self._compile(*shape)
    except Exception as e:  # Re-raised in the caller's thread by `wait` / `step`.
      self.error = e
    finally:
      self._done.set()

  def keep_only(self, shapes) -> None:
    """Drops the planned shapes not in `shapes` (those the data never uses) unless compiled already."""
    keep = {tuple(int(v) for v in s) for s in shapes}
    self.planned = [s for s in self.planned if s in keep or s in self.programs]

  def start(self) -> "TrainPrograms":
    """Starts compiling the planned shapes in a daemon thread; returns self."""
    import threading
    self._thread = threading.Thread(target=self._run, name="train-programs", daemon=True)
    self._thread.start()
    return self

  def wait(self) -> None:
    """Blocks until the planned programs are compiled (or the compilation failed: its error is raised)."""
    import time
    t = time.time()
    if self._thread is None:
      self.start()
    self._done.wait()
    self.wait_s += time.time() - t
    if self.error is not None:
      raise self.error

  def step(self, params, opt_state, inputs, labels, teacher_params=None, step=0, lr_scale=1.0):
    """`train_step` with this batch shape's compiled program: (params, opt_state, metrics)."""
    shape = tuple(inputs.shape)
    program = self.programs.get(shape)
    if program is None:
      if shape in self.planned:
        self.wait()
        program = self.programs[shape]
      else:  # Not planned: compiled now, and counted.
        import time
        t = time.time()
        program = self._compile(*shape)
        self.wait_s += time.time() - t
    return program(params, opt_state, inputs, labels, teacher_params, np.int32(step), np.float32(lr_scale))

  @property
  def count(self) -> int:
    """Programs compiled so far."""
    return len(self.programs)


def batch_shapes(tokens_per_batch: int, buckets: list[int]) -> list[tuple[int, int]]:
  """The (rows, length) shapes of `bucketed_batches` with these buckets: one per bucket, shortest first (the
  short bucket holds most pairs, so a random batch order most likely needs its program first)."""
  return [(max(1, tokens_per_batch // b), b) for b in sorted(buckets)]
