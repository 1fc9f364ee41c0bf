"""The pieces of a T5 block, as pure functions of parameter dicts.

Axis letters in einsum strings and shape comments: B batch, T query positions, S key positions, D d_model,
N heads, H head width (d_kv), F d_ff, V vocabulary.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.models.activations import ACTIVATIONS


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """T5's layer norm: no mean subtraction, no bias; variance in float32. x: [..., D], scale: [D]."""
  variance = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
  y = x.astype(jnp.float32) * jax.lax.rsqrt(variance + eps)
  return scale * y.astype(scale.dtype)


def feed_forward(p: dict, x: jax.Array, activation: str, gated: bool) -> jax.Array:
  """x: [B, T, D] -> [B, T, D]. p has wi [D, F] (or wi_0, wi_1 when gated) and wo [F, D]."""
  act = ACTIVATIONS[activation]
  if gated:
    h = act(x @ p["wi_0"]) * (x @ p["wi_1"])
  else:
    h = act(x @ p["wi"])
  return h @ p["wo"]


@functools.lru_cache(maxsize=None)
def _bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
  """Bucket of every relative position in [-(max_distance+1), max_distance+1] (index = position + max_distance+1).

  Computed on the host in float32 with the same operation order as Mesh TensorFlow and transformers, so that
  bucket boundaries (e.g. relative position 16, 32, 64 with 32 buckets) round the same way. Positions further
  away share the outermost bucket, so clipping a relative position to this range is exact.
  """
  reach = max_distance + 1
  rel = np.arange(-reach, reach + 1, dtype=np.int64)
  buckets = np.zeros_like(rel)
  if bidirectional:
    num_buckets //= 2
    buckets += (rel > 0).astype(np.int64) * num_buckets
    rel = np.abs(rel)
  else:
    rel = -np.minimum(rel, 0)
  max_exact = num_buckets // 2
  with np.errstate(divide="ignore"):
    scaled = (np.log(rel.astype(np.float32) / np.float32(max_exact)) / np.float32(math.log(max_distance / max_exact))
              * np.float32(num_buckets - max_exact))
  large = max_exact + np.where(rel < max_exact, 0, scaled).astype(np.int64)
  large = np.minimum(large, num_buckets - 1)
  buckets += np.where(rel < max_exact, rel, large)
  return buckets.astype(np.int32)


def relative_position_bias(table: jax.Array, relative_position: jax.Array, *, bidirectional: bool,
                           max_distance: int) -> jax.Array:
  """Learned bias for key_position - query_position.

  Args:
    table: [num_buckets, N] learned bias per bucket and head.
    relative_position: [B, T, S] int, key position minus query position.
  Returns:
    [B, N, T, S] float32 bias.
  """
  buckets = jnp.asarray(_bucket_table(bidirectional, table.shape[0], max_distance))
  reach = max_distance + 1
  idx = buckets[jnp.clip(relative_position, -reach, reach) + reach]  # [B, T, S]
  return jnp.moveaxis(table[idx].astype(jnp.float32), -1, 1)


def project_heads(x: jax.Array, w: jax.Array) -> jax.Array:
  """Queries: [B, T, D] x [D, N, H] -> [B, T, N, H]."""
  return jnp.einsum("btd,dnh->btnh", x, w)


def project_kv(x: jax.Array, w: jax.Array) -> jax.Array:
  """Keys and values, head-major as the caches hold them: [B, S, D] x [D, N, H] -> [B, N, S, H].

  Projected position-major, then transposed: one einsum straight to the head-major order made XLA:CPU's decoder
  step markedly slower (docs/bench/h100/gpu_profile.md)."""
  return project_heads(x, w).transpose(0, 2, 1, 3)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array | None, allowed: jax.Array,
           w_o: jax.Array) -> jax.Array:
  """Unscaled dot-product attention (T5 folds 1/sqrt(H) into its initialisation), then the output projection.

  Args:
    q: [B, T, N, H]; k, v: [B, N, S, H] (head-major, as the caches hold them).
    bias: [B, N, T, S] float32 position bias, or None (cross-attention has none).
    allowed: [B, 1, T, S] or [B, 1, 1, S] bool, True where a query may attend to a key.
    w_o: [N, H, D].
  Returns:
    [B, T, D].
  """
  scores = jnp.einsum("btnh,bnsh->bnts", q, k).astype(jnp.float32)
  if bias is not None:
    scores = scores + bias
  scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bnts,bnsh->btnh", weights, v)
  # Flattening the heads first makes the activation (T rows) take the layout the matmul wants; contracting
  # over (n, h) directly lets XLA transpose the [N, H, D] weight instead, on every call.
  n, h, d = w_o.shape
  return out.reshape(out.shape[:2] + (n * h,)) @ w_o.reshape(n * h, d)
