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


def dev_metrics(cfg, params, tokenizer, dev_pairs, max_len: int, compute_dtype: str = "float32",
                rows: int = 128) -> dict:
  """Dev loss (nats per token) and argmax accuracy, overall and per domain ("loss_natural", "acc_natural", ...).

  All pairs are padded to one shape ([rows, longest bucket]), so evaluation compiles once."""
  src, tgt = tokenize(tokenizer, (p.en for p in dev_pairs)), tokenize(tokenizer, (p.de for p in dev_pairs))
  width = next(b for b in length_buckets(max_len) if b >= min(max_len, max(map(len, src + tgt))))
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
