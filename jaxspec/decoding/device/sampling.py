"""Sampling transforms: one function turns logits into the probabilities that are actually sampled from.

Both the target's p and the draft's q go through `warp_probs` with the same knobs, so the acceptance rule
min(1, p/q) compares the distributions the tokens were really drawn from (REFERENCE.md pitfall 3).
The order is transformers' order: temperature, then top-k, then top-p.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class SamplingKnobs:
  """Per-call sampling values: arrays, so changing them never recompiles."""

  temperature: jax.Array  # [] float32, > 0 (temperature 0 is the separate greedy branch).
  top_k: jax.Array  # [] int32, 0 = off.
  top_p: jax.Array  # [] float32 in [0, 1], 1 = off (a top_p too small for float32 is 0: the top token only).

  @classmethod
  def of(cls, sampling) -> "SamplingKnobs":
    """The runtime values of a `jaxspec.Sampling`."""
    return cls.create(sampling.temperature, sampling.top_k, sampling.top_p)

  @classmethod
  def create(cls, temperature: float, top_k: int, top_p: float) -> "SamplingKnobs":
    # Host numpy scalars: jit transfers them with the call (creating three device scalars costs ~1 ms here).
    return cls(temperature=np.float32(temperature if temperature > 0 else 1.0), top_k=np.int32(top_k),
               top_p=np.float32(top_p))


def warp_probs(logits: jax.Array, knobs: SamplingKnobs, filtering: bool) -> jax.Array:
  """Probabilities after temperature, top-k and top-p.

  Args:
    logits: [..., V] float32.
    knobs: temperature (> 0), top_k (0 = off), top_p (1 = off).
    filtering: static; False skips the sort when top_k == 0 and top_p == 1.
  Returns:
    [..., V] float32 probabilities summing to 1, exactly 0 outside the kept set.

  Per-row knobs (the slot engine, jaxspec/serving): when knobs.temperature is a [B] array, logits are [B, ..., V]
  and row b uses its own temperature, top_k and top_p; a row with temperature 0 gets the one-hot distribution of
  its argmax (sampling from it is the argmax, and min(1, p/q) acceptance of one-hot p and q is greedy acceptance).
  Scalar knobs (`generate`) compile exactly the code they did before.
  """
  per_row = jnp.ndim(knobs.temperature) == 1
  if per_row:
    def row(a):  # [B] -> [B, 1, ..., 1] broadcasting against logits
      return jnp.reshape(a, a.shape + (1,) * (logits.ndim - 1))
    greedy_rows = row(knobs.temperature) <= 0
    temperature = jnp.where(greedy_rows, 1.0, row(knobs.temperature))
    top_k, top_p = row(knobs.top_k), row(knobs.top_p)
  else:
    temperature, top_k, top_p = knobs.temperature, knobs.top_k, knobs.top_p
  x = logits.astype(jnp.float32) / temperature
  if filtering:
    vocab = x.shape[-1]
    sorted_desc = -jnp.sort(-x, axis=-1)  # [..., V]
    # top-k: keep logits >= the k-th largest (ties with it are kept, as in transformers).
    if per_row:
      kth = jnp.take_along_axis(sorted_desc, jnp.broadcast_to(jnp.clip(top_k - 1, 0, vocab - 1),
                                                              x.shape[:-1] + (1,)), axis=-1)
    else:
      kth = jnp.take(sorted_desc, jnp.clip(top_k - 1, 0, vocab - 1), axis=-1)[..., None]
    kth = jnp.where(top_k > 0, kth, -jnp.inf)
    x = jnp.where(x < kth, -jnp.inf, x)
    sorted_desc = jnp.where(sorted_desc < kth, -jnp.inf, sorted_desc)
    # top-p: keep the smallest prefix of the sorted tokens whose mass reaches top_p, i.e. every token whose
    # higher-ranked tokens hold less than top_p. The first token is always kept: a top_p that float32 rounds to 0
    # (below 1.2e-38, or a denormal a device flushes) would otherwise keep none, and cutoff's index -1 everything.
    sorted_probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep = (mass_before < top_p) | (top_p >= 1.0)
    num_kept = jnp.maximum(jnp.sum(keep, axis=-1, keepdims=True), 1)
    cutoff = jnp.take_along_axis(sorted_desc, num_kept - 1, axis=-1)
    x = jnp.where(x < cutoff, -jnp.inf, x)
  probs = jax.nn.softmax(x, axis=-1)
  if per_row:
    one_hot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    probs = jnp.where(greedy_rows, one_hot, probs)
  return probs


def fold(keys: jax.Array, data: int | jax.Array) -> jax.Array:
  """[B] keys -> [B] keys with `data` folded into each: the one rule by which the loop derives a row's key for an
  iteration, a model and a draft position from the row's own key (so a row's draws never depend on other rows)."""
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, data)


def draw(greedy: bool, filtering: bool, keys: jax.Array, logits: jax.Array,
         knobs: SamplingKnobs) -> tuple[jax.Array, jax.Array | None]:
  """One token per row from logits [B, V] (keys [B]): (tokens [B] int32, q [B, V] the warped distribution they
  were drawn from, or None when greedy: the argmax)."""
  if greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
  q = warp_probs(logits, knobs, filtering)
  return sample(keys, q), q


def row_keys(key: jax.Array, batch: int) -> jax.Array:
  """[batch] keys: `key` itself when it already holds one key per row, else one per row with the row index
  folded in."""
  if key.ndim == 1:
    if key.shape[0] != batch:
      raise ValueError(f"{key.shape[0]} keys for {batch} rows.")
    return key
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(batch))


SAMPLE_BLOCK = 128  # vocabulary entries per block of `sample`'s two-level inverse CDF


def _first_above(cdf: jax.Array, mass: jax.Array, threshold: jax.Array) -> jax.Array:
  """[..., N] -> [...]: the first index with mass whose cdf exceeds threshold [...]; if rounding leaves none,
  the last index with mass. An entry without mass is never returned."""
  above = (cdf > threshold[..., None]) & (mass > 0)
  last = mass.shape[-1] - 1 - jnp.argmax(mass[..., ::-1] > 0, axis=-1)
  return jnp.where(jnp.any(above, axis=-1), jnp.argmax(above, axis=-1), last)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token per row by inverting the CDF at one uniform draw. probs: [B, V] -> [B] int32 in [0, V).

  key: [B] keys, one per row, or a single key (the row index is then folded in per row).

  Token i is drawn with probability probs[i] / sum(probs) (up to float32 rounding at block and token
  boundaries), and a token with probability 0 never is. Two levels keep it cheap on any backend: the uniform
  first picks a block of SAMPLE_BLOCK tokens by the blocks' cumulative mass, then a token inside it. One uniform
  per row instead of a Gumbel per vocabulary entry (about a third of jax.random.categorical's cost on a CPU:
  docs/benchmarks.md).
  """
  batch, vocab = probs.shape
  keys = row_keys(key, batch)
  u = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys)  # [B] in [0, 1)
  num_blocks = -(-vocab // SAMPLE_BLOCK)
  blocks = jnp.pad(probs.astype(jnp.float32), ((0, 0), (0, num_blocks * SAMPLE_BLOCK - vocab)))
  blocks = blocks.reshape(batch, num_blocks, SAMPLE_BLOCK)  # [B, NB, K]
  block_mass = jnp.sum(blocks, axis=-1)  # [B, NB]
  block_cdf = jnp.cumsum(block_mass, axis=-1)
  threshold = u * block_cdf[:, -1]
  block = _first_above(block_cdf, block_mass, threshold)  # [B]
  inside = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]  # [B, K]
  mass_before = jnp.take_along_axis(block_cdf - block_mass, block[:, None], axis=1)[:, 0]
  token = _first_above(jnp.cumsum(inside, axis=-1), inside, threshold - mass_before)
  # Always a valid id: probabilities with NaN (which the loop fails anyway) select nothing sensible.
  return jnp.clip(block * SAMPLE_BLOCK + token, 0, vocab - 1).astype(jnp.int32)


def uniform(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Uniform [0, 1) draws, shape [B, ...]; key: [B] keys or a single key (see `row_keys`)."""
  keys = row_keys(key, shape[0])
  return jax.vmap(lambda k: jax.random.uniform(k, shape[1:]))(keys)
