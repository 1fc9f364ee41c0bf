"""Stub decoders whose next-token distributions are known exactly, for testing decoding loops.

A stub's logits at decoder position t are `table[token_t] + position_bias[t]`: a position-dependent Markov
chain, so the exact probability of every output sequence can be enumerated.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspec.models.contract import CachePositions, Prefilled, StepResult


@struct.dataclass
class StubCache(CachePositions):
  lengths: jax.Array  # [B] int32
  offsets: jax.Array  # [B] int32 zeros
  position_fields: ClassVar[dict[str, int]] = {}  # no per-position arrays: `compact` only sets lengths


@dataclasses.dataclass(frozen=True)
class MarkovDecoder:
  """A `jaxspec.models.contract.Decoder` over params {"table": [V, V], "position_bias": [P, V]}; the loop's first
  token is `start`. Its decoder starts empty, as T5's: the prompt has no features ([B, 0, F]). Features (for
  feature-head drafters: `MarkovFeatureDecoder`'s params) of a position are params["features"][token fed]
  [V, D] times (i + 1) for the i-th layer asked for, concatenated; tree nodes' logits and features depend on
  their token and position only, as in a chain."""

  start: int = 0
  feature_size: int = 8
  num_feature_layers: int = 3

  def prefill(self, params, input_ids, input_lengths, cache_len, *, layers=(), encoder=False):
    zeros = jnp.zeros((input_ids.shape[0],), jnp.int32)
    features = jnp.zeros((input_ids.shape[0], 0, len(layers) * self.feature_size), jnp.float32) if layers else None
    return Prefilled(cache=StubCache(lengths=zeros, offsets=zeros), first=zeros + self.start, features=features,
                     encoder=self._encoder(params, input_ids) if encoder else None)

  def cache_axes(self):
    return StubCache(lengths=("batch",), offsets=("batch",))

  def step(self, params, cache, tokens, *, tree=None, layers=()):
    n = tokens.shape[1]
    if tree is None:
      positions = cache.lengths[:, None] + jnp.arange(n)[None]
    else:  # a tree's nodes: each node's position is lengths - P + its depth
      total = tree.ancestors.shape[2]
      positions = cache.lengths[:, None] - (total - n) + tree.depths[:, total - n:]
    logits = (params["table"][tokens] + params["position_bias"][positions]).astype(jnp.float32)
    features = self._features(params, tokens, layers) if layers else None
    return StepResult(logits=logits, features=features, cache=cache.replace(lengths=cache.lengths + n))

  def _features(self, params, tokens, layers):
    return jnp.concatenate([params["features"][tokens] * (i + 1) for i in range(len(layers))], axis=-1)

  def _encoder(self, params, input_ids):
    raise ValueError("MarkovDecoder has no encoder (MarkovEncoderFeatureDecoder has one).")


def np_warp(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
  """Reference temperature -> top-k -> top-p in numpy (written independently of jaxspec.decoding.device.sampling)."""
  x = np.asarray(logits, np.float64) / temperature
  if top_k > 0:
    kth = np.sort(x)[-top_k]
    x = np.where(x < kth, -np.inf, x)
  probs = np.exp(x - x.max())
  probs /= probs.sum()
  if top_p < 1:
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    keep = order[:int(np.searchsorted(cum, top_p)) + 1]
    mask = np.zeros_like(probs, bool)
    mask[keep] = True
    probs = np.where(mask, probs, 0.0)
    probs /= probs.sum()
  return probs


def exact_sequence_probs(next_probs, vocab: int, length: int, eos: int, start: int) -> dict:
  """{tuple(sequence): probability} for sequences of up to `length` tokens that stop at EOS.

  next_probs(prefix) -> [V] probabilities of the next token after the decoder prefix (start token first).
  """
  out = {}
  frontier = [((start,), 1.0)]
  for _ in range(length):
    nxt = []
    for prefix, prob in frontier:
      p = next_probs(prefix)
      for tok in range(vocab):
        if p[tok] == 0:
          continue
        seq = prefix + (tok,)
        if tok == eos:
          out[seq[1:]] = out.get(seq[1:], 0.0) + prob * p[tok]
        else:
          nxt.append((seq, prob * p[tok]))
    frontier = nxt
  for prefix, prob in frontier:
    out[prefix[1:]] = out.get(prefix[1:], 0.0) + prob
  return out


def chi_square(samples: list[tuple], exact: dict, min_expected: float = 5.0) -> tuple[float, int]:
  """Pearson statistic of sample counts against exact probabilities, pooling rare outcomes; (stat, dof).

  A sample never seen in `exact` (probability 0) makes the statistic infinite.
  """
  counts = {}
  for s in samples:
    counts[s] = counts.get(s, 0) + 1
  if any(s not in exact for s in counts):
    return float("inf"), 1
  n = len(samples)
  stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
  for seq, prob in exact.items():
    e = n * prob
    o = counts.get(seq, 0)
    if e >= min_expected:
      stat += (o - e) ** 2 / e
      dof += 1
    else:
      pooled_obs += o
      pooled_exp += e
  if pooled_exp > 0:
    stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-12)
    dof += 1
  return stat, max(dof, 1)


def chi_square_limit(dof: int, z: float = 4.5) -> float:
  """Wilson-Hilferty upper quantile of chi-square(dof) at a normal z (z = 4.5: p ~ 3e-6)."""
  return dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3


@dataclasses.dataclass(frozen=True)
class MarkovFeatureDecoder(MarkovDecoder):
  """`MarkovDecoder` for feature-head drafters (its params also hold "features" [V, D])."""


@dataclasses.dataclass(frozen=True)
class MarkovEncoderFeatureDecoder(MarkovFeatureDecoder):
  """`MarkovFeatureDecoder` with an encoder, for a T5 target's feature head: `prefill(..., encoder=True)` also
  returns an "encoder output" params["encoder"][input id] [B, S, De] and its mask (input id != 0). The logits
  never read it (the exact distribution stays the Markov chain's); a head that cross-attends to it drafts
  differently per row."""

  def _encoder(self, params, input_ids):
    return params["encoder"][input_ids], input_ids != 0
