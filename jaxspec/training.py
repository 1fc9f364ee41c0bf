"""Training T5 pairs with optax: teacher-forced cross-entropy, token-level distillation, resumable state.

Shapes: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from jaxspec.models import t5


def shift_right(labels: jax.Array, start_id: int) -> jax.Array:
  """Decoder inputs for teacher forcing: [start, y_1, ..., y_{T-1}]. labels: [B, T]."""
  return jnp.concatenate([jnp.full_like(labels[:, :1], start_id), labels[:, :-1]], axis=1)


def token_losses(logits: jax.Array, labels: jax.Array, pad_id: int) -> tuple[jax.Array, jax.Array]:
  """Per-token cross-entropy [B, T] and the mask of real label tokens [B, T] (EOS counts, padding does not)."""
  mask = (labels != pad_id).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels) * mask, mask


def loss_fn(params: dict, cfg: t5.T5Config, inputs: jax.Array, labels: jax.Array,
            teacher_logits: jax.Array | None = None, distill_weight: float = 0.0) -> tuple[jax.Array, dict]:
  """Mean token cross-entropy, mixed with KL(teacher || student) when teacher logits [B, T, V] are given."""
  logits = t5.forward(params, cfg, inputs, shift_right(labels, cfg.decoder_start_token_id))
  ce, mask = token_losses(logits, labels, cfg.pad_token_id)
  n = jnp.maximum(mask.sum(), 1.0)
  metrics = {"ce": ce.sum() / n, "tokens": mask.sum()}
  loss = metrics["ce"]
  if teacher_logits is not None:
    teacher = jax.nn.log_softmax(teacher_logits)
    kl = jnp.sum(jnp.exp(teacher) * (teacher - jax.nn.log_softmax(logits)), axis=-1) * mask
    metrics["kl"] = kl.sum() / n
    loss = (1 - distill_weight) * loss + distill_weight * metrics["kl"]
  return loss, metrics


def make_optimizer(learning_rate: float, warmup_steps: int, total_steps: int, weight_decay: float = 0.0,
                   clip: float = 1.0) -> optax.GradientTransformation:
  """AdamW with linear warm-up and cosine decay, gradient clipping by global norm."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, max(total_steps, warmup_steps + 1),
                                                end_value=learning_rate * 0.05)
  return optax.chain(optax.clip_by_global_norm(clip), optax.adamw(schedule, b2=0.98, weight_decay=weight_decay))


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Static settings of the train step."""

  model: t5.T5Config
  teacher: t5.T5Config | None = None
  distill_weight: float = 0.0


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 3))
def train_step(settings: StepConfig, optimizer: optax.GradientTransformation, params, opt_state, inputs, labels,
               teacher_params=None):
  """One optimizer step. Returns (params, opt_state, metrics)."""
  teacher_logits = None
  if settings.teacher is not None:
    teacher_logits = jax.lax.stop_gradient(t5.forward(
        teacher_params, settings.teacher, inputs, shift_right(labels, settings.teacher.decoder_start_token_id)))
  grads, metrics = jax.grad(loss_fn, has_aux=True)(params, settings.model, inputs, labels, teacher_logits,
                                                    settings.distill_weight)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  metrics["grad_norm"] = optax.global_norm(grads)
  return optax.apply_updates(params, updates), opt_state, metrics


@functools.partial(jax.jit, static_argnums=0)
def eval_step(cfg: t5.T5Config, params, inputs, labels):
  """Summed cross-entropy and token count of one batch."""
  logits = t5.forward(params, cfg, inputs, shift_right(labels, cfg.decoder_start_token_id))
  ce, mask = token_losses(logits, labels, cfg.pad_token_id)
  return ce.sum(), mask.sum()
