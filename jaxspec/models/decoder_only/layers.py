"""The pieces of a decoder-only block, as pure functions of parameter dicts.

Shape letters: B batch, T query positions, S key positions, D hidden, N query heads, K key/value heads,
G = N // K query heads per K/V head, H head_dim, F intermediate, V vocabulary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.models.activations import ACTIVATIONS
from jaxspec.models.decoder_only.config import Rope


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, offset: float) -> jax.Array:
  """RMSNorm over the last axis with variance in float32. x: [..., D], scale: [D].

  offset 0 (Llama): scale * normalised (cast back first); offset 1 (Gemma): (normalised * (1 + scale)) cast back.
  The two orders agree in float32 and differ in rounding in bfloat16, as in transformers.
  """
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
  if offset:
    return (y * (offset + scale.astype(jnp.float32))).astype(x.dtype)
  return scale * y.astype(x.dtype)


@functools.lru_cache(maxsize=None)
def _inv_freq(rope: Rope, head_dim: int) -> np.ndarray:
  return rope.inv_freq(head_dim)


def rope_angles(rope: Rope, head_dim: int, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(cos, sin), each [B, T, H // 2] float32, of RoPE at absolute positions [B, T] (each row its own)."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(_inv_freq(rope, head_dim))
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, T, heads, H] by (cos, sin) [B, T, H // 2] in the half-split layout of HF checkpoints."""
  half = x.shape[-1] // 2
  x1, x2 = x[..., :half], x[..., half:]
  c, s = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
  return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def project(x: jax.Array, w: jax.Array, bias: jax.Array | None = None) -> jax.Array:
  """[B, T, D] x [D, heads, H] (+ [heads, H]) -> [B, T, heads, H]."""
  y = jnp.einsum("btd,dnh->btnh", x, w)
  return y if bias is None else y + bias


def attention_mask(query_pos: jax.Array, key_pos: jax.Array, window: int | None) -> jax.Array:
  """[B, 1, 1, T, S] bool: causal (key <= query), and inside the window (key > query - window) when given."""
  q, k = query_pos[:, :, None], key_pos[None, None, :]
  allowed = k <= q
  if window is not None:
    allowed = allowed & (k > q - window)
  return allowed[:, None, None]


def attend(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, scale: float,
           softcap: float | None) -> jax.Array:
  """Grouped-query attention without repeating K and V.

  Args:
    q: [B, T, N, H]; k, v: [B, S, K, H]; allowed: [B, 1, 1, T, S] bool.
    scale: multiplies the scores; softcap: scores -> cap * tanh(scores / cap) before the mask (None: off).
  Returns:
    [B, T, N, H].
  """
  b, t, n, h = q.shape
  kv_heads = k.shape[2]
  qg = q.reshape(b, t, kv_heads, n // kv_heads, h)
  scores = jnp.einsum("btkgh,bskh->bkgts", qg, k).astype(jnp.float32) * scale
  if softcap is not None:
    scores = softcap * jnp.tanh(scores / softcap)
  scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bkgts,bskh->btkgh", weights, v).reshape(b, t, n, h)


def output_projection(x: jax.Array, w_o: jax.Array, bias: jax.Array | None = None) -> jax.Array:
  """[B, T, N, H] x [N, H, D] (+ [D]) -> [B, T, D], heads flattened first (one matmul, no weight transpose)."""
  n, h, d = w_o.shape
  y = x.reshape(x.shape[:2] + (n * h,)) @ w_o.reshape(n * h, d)
  return y if bias is None else y + bias


def gated_mlp(p: dict, x: jax.Array, activation: str) -> jax.Array:
  """down(act(gate(x)) * up(x)): [B, T, D] -> [B, T, D] with gate, up [D, F] and down [F, D]."""
  return (ACTIVATIONS[activation](x @ p["gate"]) * (x @ p["up"])) @ p["down"]


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
  return x if cap is None else cap * jnp.tanh(x / cap)
