"""Training an EAGLE-3 head: the training-time test (SpecForge's unroll of draft steps), its loss, the optimizer
and the jitted train step.

    logits, prenorm = unroll(params, cfg, embed, features, tokens, steps)  # [S, B, W, Vd], [S, B, W, H]
    loss, metrics = ttt_loss(params, settings, embed, batch)           # batch: head_data.HeadBatch
    params, opt_state, metrics = train_step(settings, params, opt_state, embed, batch)

The unroll (docs/heads.md, "Alignment"). Step 0 is the head's prefill of the row: entry t pairs the fused
target feature of position t with token t + 1, at RoPE position t, and predicts token t + 2. Step i > 0 at index
t feeds the head's own pre-norm output of step i - 1 at index t with the real token t + 1 + i, at position t + i,
and predicts token t + 2 + i. It attends to the step-0 keys at indices <= t and to the keys of steps 1..i at index
t: the cache a drafter holds when it chains i steps after position t (entries 0..t from the target's features,
then its own chain), so the head is trained on what `HeadDrafter` runs (tests/training/test_train_head.py
checks the unroll against `eagle3.prefill` + `eagle3.feed`). Teacher-forced: the chain is fed the real tokens.

The loss (SpecForge's OnlineEagle3Model + LogSoftmaxLoss, weights of its training strategy): step i weighs
decay ** i (0.8 ** i); its term is the soft cross-entropy -sum_d p(d) log q(d) between the target's
distribution over the draft vocabulary (renormalised there: `HeadBatch.target_p`) and the head's, summed over
the positions that train at that step (the label's mask, shifted with the step) and divided by the positions
that train at step 0: one denominator for every step, so later steps, with fewer positions, weigh less, as in
the reference (which divides by every position, B * W). The target's embedding is an argument, never trained;
d2t / t2d are not in the trained parameters (`split_params`).

Shapes: B batch, W row width, H the head's hidden size, N / K query / key-value heads, Hd head_dim, Vd draft
vocabulary, J = steps - 1 chain slots, S steps.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxspec.models import eagle3
from jaxspec.training.head_data import HeadBatch

VOCAB_MAPS = ("d2t", "t2d")


@dataclasses.dataclass(frozen=True)
class HeadStepConfig:
  """Static settings of the train step (hashable: equal settings share one compiled step)."""

  head: eagle3.Eagle3Config
  ttt_steps: int = 7  # Draft steps unrolled per row (SpecForge's `length`).
  decay: float = 0.8  # Step i of the unroll weighs decay ** i.
  learning_rate: float = 1e-4
  warmup_steps: int = 0  # Linear warm-up from 0.
  total_steps: int | None = None  # Cosine decay to 0 at this step after the warm-up; None: constant.
  b1: float = 0.9
  b2: float = 0.95
  weight_decay: float = 0.0
  clip: float = 0.5  # Gradient clipping by global norm.


def make_optimizer(s: HeadStepConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(s.clip), then AdamW(b1, b2) with linear warm-up and (with total_steps) cosine decay."""
  warmup = max(s.warmup_steps, 0)
  if s.total_steps is None:
    schedule = optax.linear_schedule(0.0, s.learning_rate, warmup) if warmup else s.learning_rate
  else:
    schedule = optax.warmup_cosine_decay_schedule(0.0 if warmup else s.learning_rate, s.learning_rate, warmup,
                                                  max(s.total_steps, warmup + 1), end_value=0.0)
  return optax.chain(optax.clip_by_global_norm(s.clip),
                     optax.adamw(schedule, b1=s.b1, b2=s.b2, weight_decay=s.weight_decay))


def init_weights(cfg: eagle3.Eagle3Config, seed: int, std: float = 0.02) -> dict:
  """The trained weights of a new head (no vocabulary maps): N(0, std) float32, norms the identity. Drawn with
  numpy on the host (jax.random would compile one program per parameter shape)."""
  shapes = eagle3.param_shapes(cfg)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(
      {k: v for k, v in shapes.items() if k not in VOCAB_MAPS}, is_leaf=lambda x: isinstance(x, tuple))
  rng = np.random.default_rng(seed)
  out = [jnp.ones(shape, jnp.float32) if path[-1].key.endswith("norm") else
         jnp.asarray(rng.normal(0.0, std, shape), jnp.float32) for path, shape in leaves]
  return jax.tree_util.tree_unflatten(treedef, out)


def split_params(params: dict) -> tuple[dict, dict]:
  """(trained weights, the vocabulary maps {"d2t", "t2d"}) of an eagle3 parameter tree."""
  return ({k: v for k, v in params.items() if k not in VOCAB_MAPS}, {k: params[k] for k in VOCAB_MAPS})


def shift(x: jax.Array, k: int) -> jax.Array:
  """x [B, W, ...] moved k places left along W, zero-filled on the right: shift(x, k)[:, t] = x[:, t + k]."""
  if k == 0:
    return x
  pad = jnp.zeros((x.shape[0], k) + x.shape[2:], x.dtype)
  return jnp.concatenate([x[:, k:], pad], axis=1)


def _attend(q: jax.Array, k0: jax.Array, v0: jax.Array, chain_k: jax.Array, chain_v: jax.Array, chained: jax.Array,
            scale: float) -> jax.Array:
  """Attention of one step's queries q [B, W, N, Hd]: index t sees the step-0 keys k0 / v0 [B, W, K, Hd] at
  indices <= t and the chain keys chain_k / chain_v [J, B, W, K, Hd] at index t of the slots j < chained (slot j
  holds step j + 1's; the current step's own included). One softmax over both parts, in float32."""
  b, w, n, hd = q.shape
  kv_heads = k0.shape[2]
  qg = q.reshape(b, w, kv_heads, n // kv_heads, hd)
  low = jnp.finfo(jnp.float32).min
  scores = jnp.einsum("btkgh,bskh->bkgts", qg, k0).astype(jnp.float32) * scale  # [B, K, G, W, W]
  causal = jnp.arange(w)[None, :] <= jnp.arange(w)[:, None]  # [W (query), W (key)]
  scores = jnp.where(causal, scores, low)
  diag = jnp.einsum("btkgh,jbtkh->bkgtj", qg, chain_k).astype(jnp.float32) * scale  # [B, K, G, W, J]
  diag = jnp.where(jnp.arange(chain_k.shape[0]) < chained, diag, low)
  weights = jax.nn.softmax(jnp.concatenate([scores, diag], axis=-1), axis=-1).astype(v0.dtype)
  out = (jnp.einsum("bkgts,bskh->btkgh", weights[..., :w], v0)
         + jnp.einsum("bkgtj,jbtkh->btkgh", weights[..., w:], chain_v))
  return out.reshape(b, w, n, hd)


def unroll(params: dict, cfg: eagle3.Eagle3Config, embed: jax.Array, features: jax.Array, tokens: jax.Array,
           steps: int, encoder: eagle3.EncoderKV | None = None) -> tuple[jax.Array, jax.Array]:
  """The head's training-time test over whole rows (the module docstring). Steps 1..steps-1 are one `lax.scan`
  (one compiled body, whatever the number of steps), their chain keys in a buffer of steps - 1 slots.

  Args:
    params: the head's weights (vocabulary maps not needed); embed: [V, H] the target's embedding (frozen).
    features: [B, W, 3 Ht] the target's features of every position; tokens: [B, W] int the rows.
    steps: draft steps to unroll (static, >= 1).
    encoder: a T5 target's head: its cross-attention keys and values of the target's encoder output
      (`eagle3.encoder_kv`), read by every step; None for a decoder-only target's head.
  Returns:
    draft logits [steps, B, W, Vd] float32 and pre-norm outputs [steps, B, W, H]: step i's index t predicts
    token t + 2 + i.
  """
  batch, width = tokens.shape
  g = eagle3.fuse(params, cfg, features)  # [B, W, H]
  index = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32)[None, :], (batch, width))
  q, k0, v0 = eagle3.attention_inputs(params, cfg, embed, g, shift(tokens, 1), index)
  empty = jnp.zeros((max(steps - 1, 1),) + k0.shape, k0.dtype)  # [J, B, W, K, Hd]
  scale = cfg.head_dim ** -0.5
  hidden = eagle3.layer_output(params, cfg, g, _attend(q, k0, v0, empty, empty, 0, scale), encoder)

  def chain_step(carry, i):
    hidden, chain_k, chain_v = carry
    toks = jnp.take_along_axis(tokens, jnp.minimum(index + 1 + i, width - 1), axis=1)  # token t + 1 + i
    toks = jnp.where(index + 1 + i < width, toks, 0)
    q, k, v = eagle3.attention_inputs(params, cfg, embed, hidden, toks, index + i)
    chain_k = jax.lax.dynamic_update_index_in_dim(chain_k, k, i - 1, axis=0)
    chain_v = jax.lax.dynamic_update_index_in_dim(chain_v, v, i - 1, axis=0)
    hidden = eagle3.layer_output(params, cfg, hidden, _attend(q, k0, v0, chain_k, chain_v, i, scale), encoder)
    return (hidden, chain_k, chain_v), (eagle3.draft_logits(params, cfg, hidden), hidden)

  first = (eagle3.draft_logits(params, cfg, hidden)[None], hidden[None])
  if steps == 1:
    return first
  _, (logits, prenorm) = jax.lax.scan(chain_step, (hidden, empty, empty), jnp.arange(1, steps, dtype=jnp.int32))
  return jnp.concatenate([first[0], logits]), jnp.concatenate([first[1], prenorm])


def ttt_loss(params: dict, settings: HeadStepConfig, embed: jax.Array, batch: HeadBatch) -> tuple[jax.Array, dict]:
  """The weighted loss of the unroll (the module docstring) and metrics: loss_i and acc_i per step (acc: the
  share of trained positions where the head's argmax is the target's), `positions` (trained at step 0)."""
  if settings.head.cross_attention != (batch.encoded is not None):
    raise ValueError("a T5 target's head trains on batches with the encoder's output (head_data.capture_encdec), "
                     "a decoder-only target's head on batches without (head_data.capture).")
  encoder = None
  if batch.encoded is not None:  # a T5 target's head: cross-attention keys and values from its trained projections
    encoder = eagle3.encoder_kv(params, settings.head, batch.encoded, batch.encoder_mask)
  logits, _ = unroll(params, settings.head, embed, batch.features, batch.tokens, settings.ttt_steps, encoder)
  steps = settings.ttt_steps
  p = jnp.stack([shift(batch.target_p, 1 + i) for i in range(steps)])  # [S, B, W, Vd] index t: position t + 1 + i
  mask = jnp.stack([shift(batch.mask, 1 + i) for i in range(steps)])  # [S, B, W]
  ce = -jnp.sum(p * jax.nn.log_softmax(logits, axis=-1), axis=-1)  # [S, B, W]
  denom = jnp.maximum(jnp.sum(mask[0]), 1).astype(jnp.float32)
  terms = jnp.sum(jnp.where(mask, ce, 0.0), axis=(1, 2)) / denom  # [S]
  hits = (jnp.argmax(logits, axis=-1) == jnp.argmax(p, axis=-1)) & mask
  accs = jnp.sum(hits, axis=(1, 2)) / jnp.maximum(jnp.sum(mask, axis=(1, 2)), 1)
  loss = jnp.sum(settings.decay ** jnp.arange(steps, dtype=jnp.float32) * terms)
  metrics = {"loss": loss, "positions": jnp.sum(mask[0])}
  for i in range(steps):
    metrics[f"loss_{i}"], metrics[f"acc_{i}"] = terms[i], accs[i]
  return loss, metrics


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def train_step(settings: HeadStepConfig, params: dict, opt_state, embed: jax.Array,
               batch: HeadBatch) -> tuple[dict, optax.OptState, dict]:
  """One optimizer step on the trained weights `params` (no d2t / t2d). Returns (params, opt_state, metrics)."""
  grads, metrics = jax.grad(ttt_loss, has_aux=True)(params, settings, embed, batch)
  updates, opt_state = make_optimizer(settings).update(grads, opt_state, params)
  metrics["grad_norm"] = optax.global_norm(grads)
  return optax.apply_updates(params, updates), opt_state, metrics
