"""A draft model as the slot engine runs it under a load table: catching up after plain steps, and rows that
never draft because their request arrived while the load ran plain. The slot engine (jaxspec/serving) gets it
through `registry.served`, never by name.

Why. Under a `SpeculationTable` with plain entries (the full server decodes without drafting) two things differ
from `generate`:
- the draft lags while the engine runs plain steps, and catches up when drafting resumes: a chain is asked
  through the variable path (a limit per row), whose catch-up re-feeds any lag in one call;
- a request inserted while the load runs plain would pay the draft's prompt prefill for drafts it may never make
  (on the Qwen2.5-Coder 1.5B / 0.5B pair that is a third more prefill per request, which made the full server
  slower than plain: docs/serving.md). So `insert` prefills the draft only when the table drafts at the load it is
  inserted at; a row inserted without it drafts no chain (its limit is 0: the target decodes it alone, exactly;
  in a tree step its tree is junk, verified like any other, and its lag does not widen the catch-up call) and its
  draft cache is zeros. When the load falls to an entry that drafts, the engine prefills the draft of each such
  row still active ("wakes" it: the serving engine's _WAKE, the prompt only) and the row drafts from then on, its catch-up
  feeding the tokens generated meanwhile. So a draft model's prefill is paid only by requests that draft.

The drafter's state is `ServedDraftState`: the draft cache and, per row, whether the row drafts. Everything else is
the wrapped `ModelDrafter`'s (model_drafter.py; the protocol: decoding/device/drafter.py).

Shapes: B rows, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding.drafters.model_drafter import ModelDrafter


@struct.dataclass
class ServedDraftState:
  cache: Any  # the draft model's cache
  drafts: jax.Array  # [B] bool: the row's draft cache was prefilled at insert (False: the row never drafts)


@struct.dataclass
class _After:
  inner: Any  # the wrapped drafter's `Proposal.after`
  drafts: jax.Array  # [B] bool, carried through the iteration


@dataclasses.dataclass(frozen=True)
class ServedDraftModel:
  """`inner` (a draft model) with per-row drafting (module docstring). prefill: static; False makes `init` write
  zeros and rows that never draft (the insert program for a load the table runs plain)."""

  inner: ModelDrafter
  prefill: bool = True
  may_find_nothing: bool = True  # rows still behind after the catch-up, and rows that never draft, draft nothing
  feature_layers: tuple[int, ...] = ()
  reads_encoder: bool = False

  @property
  def default_cost(self) -> float:
    return self.inner.default_cost

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None) -> ServedDraftState:
    rows = input_ids.shape[0]
    if self.prefill:
      cache = self.inner.init(params, input_ids, input_lengths, cache_len, features=features, encoder=encoder)
      return ServedDraftState(cache=cache, drafts=jnp.ones((rows,), bool))
    shapes = jax.eval_shape(lambda: self.inner.init(params, input_ids, input_lengths, cache_len,
                                                    features=features, encoder=encoder))
    cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return ServedDraftState(cache=cache, drafts=jnp.zeros((rows,), bool))

  def propose(self, request):
    state, history = request.state, request.history
    limit = request.limit
    if limit is None:
      limit = jnp.full(history.lengths.shape, request.static.gamma, jnp.int32)
    limit = jnp.where(history.done | ~state.drafts, 0, limit).astype(jnp.int32)
    proposal = self.inner.propose(request._replace(state=state.cache, limit=limit, some_row_drafts=False))
    return proposal.replace(after=_After(proposal.after, state.drafts))

  def propose_tree(self, params, state, history, static, knobs, keys):
    """A tree per row; a row that never drafts proposes junk (verified: exact) and does not set the catch-up's
    width (it counts as done there)."""
    quiet = dataclasses.replace(history, done=history.done | ~state.drafts)
    proposal = self.inner.propose_tree(params, state.cache, quiet, static, knobs, keys)
    return proposal.replace(after=_After(proposal.after, state.drafts))

  def idle(self, state, history, static):
    proposal = self.inner.idle(state.cache, history, static)
    return proposal.replace(after=_After(proposal.after, state.drafts))

  def settle(self, verdict) -> ServedDraftState:
    after = verdict.proposal.after
    cache = self.inner.settle(verdict._replace(proposal=verdict.proposal.replace(after=after.inner)))
    return ServedDraftState(cache=cache, drafts=after.drafts)
