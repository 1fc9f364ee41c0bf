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

from jaxspec.decoding.device import sampling
from jaxspec.decoding.drafters import tree
from jaxspec.decoding.device.drafter import Proposal, ProposalSettings

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


class LearnedDrafter:
  """What the learned drafters (model_drafter.ModelDrafter, head_drafter.HeadDrafter and its T5 variant) share
  behind the `Drafter` protocol: the propose dispatch (every row drafts gamma tokens under "constant", at most
  limit[b] otherwise), the variable-length skeleton (no draft call when no row drafts, unless the loop knows one
  does), `idle`, and `propose_tree`'s skeleton (EAGLE-2's dynamic tree, `tree.draft_tree`). A subclass keeps only
  what differs, in these hooks:

    _begin(params, state, history, static, needed, variable, refeed) -> (first [B, V], carry, begun):
        the first token's logits, the chain's carry (`Step`'s) and whatever `_drafted` reads of how far each
        row got (a draft model's catch-up call: needed [B] bool rows that draft, variable / refeed its widths);
    _step(params) -> Step: one token per row;
    _drafted(state, carry, begun, steps) -> the proposal's `after` (steps: [] int32 step calls after `_begin`);
    _rested(state) -> the `after` of a proposal of nothing;
    _row_limit(limit, begun, lengths) -> [B] the most tokens each row drafts after `_begin` (default: limit);
    _vocab(params, state, history) -> V (q's last axis, for a skipped sampled draft);
    _tree_carry(carry) -> draft_tree's carry (default: carry); _beam_step(params, rank) -> draft_tree's step.

  `settle` and `init` are each drafter's own.
  """

  def propose(self, request) -> Proposal:
    if request.limit is None:
      return self._propose_fixed(request)
    return self._propose_variable(request)

  def idle(self, state, history, static) -> Proposal:
    return Proposal.nothing(history, static, self._rested(state))

  def propose_tree(self, params, state, history, static, knobs, keys):
    """A tree of static.tree's shape and depth gamma per row (`tree.draft_tree`): the first depth ranked from
    `_begin`'s logits, each further depth's beam fed once (`_beam_step`); when sampling, every expanded node's
    children are drawn from the drafter's q (the proposal's `siblings`, verified by recursive rejection sampling).
    The tree's entries are speculative: `settle` drops them."""
    first, carry, begun = self._begin(params, state, history, static, ~history.done, True, False)
    rank = lambda logits: tree.draft_logprobs(logits, static.greedy, static.filtering, knobs)
    proposal = tree.draft_tree(history.last, rank(first), self._beam_step(params, rank), self._tree_carry(carry),
                               static.tree, static.gamma, keys=None if static.greedy else keys)
    return proposal.replace(after=self._drafted(state, proposal.after, begun, jnp.int32(0)))

  def _row_limit(self, limit: jax.Array, begun: Any, lengths: jax.Array) -> jax.Array:
    return limit

  def _tree_carry(self, carry: Any) -> Any:
    return carry

  def _propose_fixed(self, request) -> Proposal:
    """gamma tokens for every row (schedule "constant"); finished rows need no catch-up."""
    params, state, history, static = request.params, request.state, request.history, request.static
    first, carry, begun = self._begin(params, state, history, static, ~history.done, False, False)
    tokens, q, carry = draw_fixed(first, self._step(params), carry, static, request.knobs, request.keys)
    return Proposal(tokens=tokens, counts=None, q=q,
                    after=self._drafted(state, carry, begun, jnp.int32(static.gamma - 1)))

  def _propose_variable(self, request) -> Proposal:
    """At most limit[b] tokens for row b ([B] int32 in [0, G], 0 = none), each row stopping after a token whose
    distribution's top probability is below `confidence` ([] float32). With no row to draft, no draft call at all
    (a `lax.cond`, unless some_row_drafts)."""
    params, history, limit, static = request.params, request.history, request.limit, request.static
    gamma, batch = static.gamma, history.lengths.shape[0]

    def draft(state):
      first, carry, begun = self._begin(params, state, history, static, limit > 0, True, True)
      row_limit = self._row_limit(limit, begun, history.lengths)
      tokens, q, counts, carry, steps = draw_variable(first, self._step(params), carry, row_limit, static,
                                                      request.knobs, request.confidence, request.keys)
      return Proposal(tokens=tokens, counts=counts, q=q, after=self._drafted(state, carry, begun, steps))

    def skip(state):
      q = None
      if not static.greedy:
        q = jnp.zeros((batch, gamma, self._vocab(params, state, history)), jnp.float32)
      return Proposal(tokens=jnp.zeros((batch, gamma), jnp.int32), counts=jnp.zeros((batch,), jnp.int32), q=q,
                      after=self._rested(state))

    if request.some_row_drafts:
      return draft(request.state)
    return jax.lax.cond(jnp.any(limit > 0), draft, skip, request.state)
