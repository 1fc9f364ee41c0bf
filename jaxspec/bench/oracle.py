"""An oracle draft: a real draft's cost with a chosen acceptance rate. A benchmark tool, not library API.

The paper's speedups need alpha, which only trained pairs give; the costs need only the shapes. `OracleDecoder`
joins the two: every call runs a real decoder step (e.g. a T5-small-shaped T5 with random weights) in full, so it
costs exactly what that draft costs, then overrides the proposal. The token it proposes after loop position t
(the token at sequences[:, t + 1], generated token t) is the target's own greedy token there when
`accept_mask(seed, t, alpha)` holds, else a different token:

    greedy = greedy_tokens(target_decoder, target_params, ids, lengths, max_new_tokens + gamma + 1)
    draft = OracleDecoder(t5.T5Decoder(small_config))
    params = oracle_params(small_params, greedy, seeds, alpha)   # the loop's draft_params

Acceptance is decided per (row, generated position) by a hash of (row seed, position), so at temperature 0 the
loop runs the i.i.d. acceptance model of the paper's Theorem 3.8 at rate alpha: a position drafted again after an
earlier rejection gets the same answer, but its first answer was never seen (it came after the first rejection),
so the process stays i.i.d. Only temperature 0 is meaningful: when sampling, acceptance depends on p and q, not
on alpha.

The real logits are not dead code: the output is `where(vocab id == greedy token, +-BIG, real logits)`, which the
loop's argmax reads in full, so XLA must compute the whole draft step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.decoding import loop, placement, sampling
from jaxspec.decoding.drafter import PlainDrafter
from jaxspec.decoding.model_drafter import ModelDrafter
from jaxspec.models.contract import Decoder

BIG = 1e9  # Above any real logit: the proposed token's logit (or minus it for a rejected position).
_MIX = (0x9E3779B1, 0x85EBCA77, 0x85EBCA6B, 0xC2B2AE35)  # Weyl constants, then murmur3's fmix32 multipliers.


def _uniform(seeds, positions, xp):
  """A uniform in [0, 1) per (seed, position): murmur3's finaliser over seed * a + position * b (uint32)."""
  u32 = xp.uint32
  x = xp.asarray(seeds).astype(u32) * u32(_MIX[0]) + xp.asarray(positions).astype(u32) * u32(_MIX[1])
  x = x ^ (x >> u32(16))
  x = x * u32(_MIX[2])
  x = x ^ (x >> u32(13))
  x = x * u32(_MIX[3])
  x = x ^ (x >> u32(16))
  return (x >> u32(8)).astype(xp.float32) * xp.float32(2.0 ** -24)


def accept_mask(seeds: jax.Array, positions: jax.Array, alpha: jax.Array) -> jax.Array:
  """Whether the oracle proposes the greedy token: seeds [B, 1] uint32, positions [B, T] int32 -> [B, T] bool."""
  return _uniform(seeds, positions, jnp) < alpha


def accept_mask_np(seeds: np.ndarray, positions: np.ndarray, alpha: float) -> np.ndarray:
  """`accept_mask` in numpy (the same bits), for tests and for the designed acceptance of a run."""
  with np.errstate(over="ignore"):
    return _uniform(seeds, positions, np) < np.float32(alpha)


def oracle_params(model_params, greedy: jax.Array, seeds: jax.Array, alpha: float) -> dict:
  """The oracle's parameter pytree (the loop's draft_params).

  Args:
    model_params: the wrapped decoder's parameters.
    greedy: [B, N] int32, the target's greedy tokens: N >= max_new_tokens + gamma + 1 covers every position the
      loop can draft (positions past N propose greedy[:, N - 1], whose acceptance is not controlled).
    seeds: [B] uint32, one per row: rows with different seeds accept at different positions.
    alpha: the acceptance rate, in [0, 1] (a runtime value: changing it does not recompile).
  """
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}.")
  return {"model": model_params, "greedy": jnp.asarray(greedy, jnp.int32),
          "seeds": jnp.asarray(seeds, jnp.uint32), "alpha": jnp.float32(alpha)}


@dataclasses.dataclass(frozen=True)
class OracleDecoder:
  """A `Decoder` that runs `inner`'s step for its cost and proposes the target's greedy token at rate alpha."""

  inner: Decoder

  @property
  def num_feature_layers(self) -> int:
    return self.inner.num_feature_layers

  @property
  def feature_size(self) -> int:
    return self.inner.feature_size

  def prefill(self, params: dict, input_ids: jax.Array, input_lengths: jax.Array, cache_len: int, *,
              layers: tuple[int, ...] = (), encoder: bool = False):
    return self.inner.prefill(params["model"], input_ids, input_lengths, cache_len, layers=layers, encoder=encoder)

  def step(self, params: dict, cache, tokens: jax.Array, *, tree=None, layers: tuple[int, ...] = ()):
    """tokens [B, T] -> StepResult whose logits [B, T, V] float32 have the oracle's proposal as argmax (a chain;
    tree nodes are not positions of one sequence: the oracle drafts chains only)."""
    if tree is not None:
      raise ValueError("the oracle drafter drafts chains only (no token trees).")
    positions = cache.positions[:, None] + jnp.arange(tokens.shape[1])  # [B, T]: predicts generated token t
    res = self.inner.step(params["model"], cache, tokens, layers=layers)
    logits, cache = res.logits, res.cache
    greedy = params["greedy"]
    want = jnp.take_along_axis(greedy, jnp.clip(positions, 0, greedy.shape[1] - 1), axis=1)  # [B, T]
    value = jnp.where(accept_mask(params["seeds"][:, None], positions, params["alpha"]), BIG, -BIG)
    hit = jnp.arange(logits.shape[-1]) == want[..., None]  # [B, T, V]
    return res.replace(logits=jnp.where(hit, value[..., None].astype(logits.dtype), logits), cache=cache)


def plain_settings(target: Decoder, max_new_tokens: int) -> loop.LoopSettings:
  """Greedy plain decoding that never stops early (no EOS id), as the oracle's benchmarks run it."""
  return loop.LoopSettings(target=target, drafter=PlainDrafter(), gamma=0, max_new_tokens=max_new_tokens,
                           greedy=True, filtering=False, eos_ids=(-1,), pad_id=0)


def oracle_settings(target: Decoder, draft: OracleDecoder, gamma: int, max_new_tokens: int) -> loop.LoopSettings:
  """Greedy speculative decoding with the oracle draft, no EOS id (every row runs max_new_tokens)."""
  return dataclasses.replace(plain_settings(target, max_new_tokens), drafter=ModelDrafter(draft), gamma=gamma)


def decode(settings: loop.LoopSettings, target_params, draft_params, ids: jax.Array, lengths: jax.Array):
  """Prefill and loop as `jaxspec.generate` runs them; returns the final `LoopState` (blocked on)."""
  batch = ids.shape[0]
  target_cache, draft_cache, first = placement.PREFILL(settings, target_params, draft_params, ids, lengths)
  state = placement.RUN(settings, target_params, draft_params, target_cache, draft_cache, first,
               sampling.SamplingKnobs.create(0.0, 0, 1.0), jnp.zeros((batch,), jnp.uint32),
               jnp.arange(batch, dtype=jnp.int32))
  return jax.block_until_ready(state)


def greedy_tokens(target: Decoder, target_params, ids: jax.Array, lengths: jax.Array, n: int) -> jax.Array:
  """[B, n] int32: the target's greedy continuation (plain decoding, no EOS), the oracle's answer key."""
  state = decode(plain_settings(target, n), target_params, None, ids, lengths)
  return state.sequences[:, 1:1 + n]
