"""Drafting a chain autoregressively: the part every learned drafter shares (a draft model, a feature head).

A drafter gives the logits of its first token and a `step(carry, token [B]) -> (logits [B, V], carry)` that feeds
one token per row (its cache, and whatever else it threads: the head's pre-norm output); this module draws the
tokens with `sampling.draw` (q is exactly what each was drawn from) and keys `sampling.fold(keys, j)` for draft
position j, so a drafter's draws depend only on its row's key.

  - `draw_fixed`: gamma tokens for every row (schedule "constant"), a `lax.scan` of gamma - 1 steps;
  - `draw_variable`: at most limit[b] tokens for row b, a row stopping after a token whose distribution's top
    probability is below `confidence`; its `lax.while_loop` steps only while some row still drafts.

Shapes: B batch, G = gamma, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxspec.decoding import sampling
from jaxspec.decoding.drafter import ProposalSettings

Step = Callable[[Any, jax.Array], tuple[jax.Array, Any]]  # (carry, token [B]) -> (logits [B, V], carry)


def top_prob(logits: jax.Array, q: jax.Array | None) -> jax.Array:
  """[B] the largest probability of the distribution a token was drawn from (softmax of logits when greedy)."""
  if q is not None:
    return jnp.max(q, axis=-1)
  return 1.0 / jnp.sum(jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True)), axis=-1)


def draw_fixed(first: jax.Array, step: Step, carry: Any, static: ProposalSettings, knobs: sampling.SamplingKnobs,
               keys: jax.Array) -> tuple[jax.Array, jax.Array | None, Any]:
  """(tokens [B, G], q [B, G, V] or None when greedy, carry after feeding x_1 .. x_{G-1}) from the first token's
  logits first [B, V]."""
  x1, q1 = sampling.draw(static.greedy, static.filtering, sampling.fold(keys, 0), first, knobs)

  def one_step(c, j):
    carry, token = c
    logits, carry = step(carry, token)
    x, q = sampling.draw(static.greedy, static.filtering, sampling.fold(keys, j), logits, knobs)
    return (carry, x), (x, q)

  (carry, _), (xs, qs) = jax.lax.scan(one_step, (carry, x1), jnp.arange(1, static.gamma))
  tokens = jnp.concatenate([x1[:, None], xs.T], axis=1)
  q = None if static.greedy else jnp.concatenate([q1[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
  return tokens, q, carry


def draw_variable(first: jax.Array, step: Step, carry: Any, limit: jax.Array, static: ProposalSettings,
                  knobs: sampling.SamplingKnobs, confidence: jax.Array, keys: jax.Array):
  """At most limit[b] tokens for row b ([B] int32 in [0, G]; 0 drafts nothing, the first token is then junk).

  Returns:
    (tokens [B, G] (junk at >= counts), q [B, G, V] or None when greedy, counts [B] int32, carry, steps [] int32:
    the step calls made, each feeding x_1, x_2, ... to every row).
  """
  gamma, batch = static.gamma, first.shape[0]
  x1, q1 = sampling.draw(static.greedy, static.filtering, sampling.fold(keys, 0), first, knobs)
  tokens = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x1)
  qs = None if q1 is None else jnp.zeros((batch, gamma) + q1.shape[-1:], jnp.float32).at[:, 0].set(q1)
  counts = (limit > 0).astype(jnp.int32)
  going = (counts > 0) & (limit > 1) & (top_prob(first, q1) >= confidence)

  def body(c):
    carry, j, tokens, qs, counts, going = c  # j tokens drafted so far; x_j is fed now
    logits, carry = step(carry, jax.lax.dynamic_slice_in_dim(tokens, j - 1, 1, 1)[:, 0])
    x, q = sampling.draw(static.greedy, static.filtering, sampling.fold(keys, j), logits, knobs)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, x[:, None], j, axis=1)
    if qs is not None:
      qs = jax.lax.dynamic_update_slice_in_dim(qs, q[:, None], j, axis=1)
    counts = counts + going
    going = going & (limit > j + 1) & (top_prob(logits, q) >= confidence)
    return carry, j + 1, tokens, qs, counts, going

  carry, j, tokens, qs, counts, _ = jax.lax.while_loop(
      lambda c: (c[1] < gamma) & jnp.any(c[5]), body, (carry, jnp.int32(1), tokens, qs, counts, going))
  return tokens, qs, counts, carry, j - 1
