"""A draft model as the slot engine runs it: its prompt prefill deferred past the first token, catching up after
plain steps, and rows that draft nothing while the load runs plain. The slot engine (jaxspec/serving) gets these
through `registry.served`, never by name.

Why. The first token must not wait for the draft (issue 39): `insert` computes the request's first token with the
target alone and writes a zero draft cache (`Deferred`: the insert's drafter); the engine prefills the draft of
each such row ("wakes" it: the serving engine's _WAKE, the prompt only) right before the first step that drafts, and the row
drafts from then on, its catch-up feeding the tokens generated meanwhile (one token after the insert). So the
draft's prefill is paid after the first token, and only by requests that draft.

Under a `SpeculationTable` with plain entries (the full server decodes without drafting), and under the
verification budget (jaxspec/serving/budget.py: plain is one of its tiers, and its per-row limits reach the
draft through `DraftRequest.limit`), the draft model is wrapped in `ServedDraftModel`, because two more things
differ from `generate`:
- the draft lags while the engine runs plain steps, and catches up when drafting resumes: a chain is asked
  through the variable path (a limit per row), whose catch-up re-feeds any lag in one call;
- a row not yet woken (inserted while the load runs plain, which on the Qwen2.5-Coder 1.5B / 0.5B pair would
  otherwise pay a third more prefill per request for drafts it may never make: docs/serving.md) drafts no chain
  (its limit is 0: the target decodes it alone, exactly; in a tree step its tree is junk, verified like any
  other, and its lag does not widen the catch-up call); it is woken when the load falls to an entry that drafts.
Without plain or tree entries every step drafts, so every row is woken before its first step and the plain
`ModelDrafter` (lag at most 1 after the wake) runs as in `generate`.

The wrapped drafter's state is `ServedDraftState`: the draft cache and, per row, whether the row drafts (False
in the zero state `Deferred` writes). Everything else is the wrapped `ModelDrafter`'s
(model_drafter.py; the protocol: decoding/device/drafter.py).

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
  drafts: jax.Array  # [B] bool: the row's draft cache is prefilled (False: not woken yet, the row drafts nothing)


@struct.dataclass
class _After:
  inner: Any  # the wrapped drafter's `Proposal.after`
  drafts: jax.Array  # [B] bool, carried through the iteration


@dataclasses.dataclass(frozen=True)
class ServedDraftModel:
  """`inner` (a draft model) with per-row drafting (module docstring)."""

  inner: ModelDrafter
  may_find_nothing: bool = True  # rows still behind after the catch-up, and rows not woken, draft nothing
  feature_layers: tuple[int, ...] = ()
  reads_encoder: bool = False

  @property
  def default_cost(self) -> float:
    return self.inner.default_cost

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None) -> ServedDraftState:
    cache = self.inner.init(params, input_ids, input_lengths, cache_len, features=features, encoder=encoder)
    return ServedDraftState(cache=cache, drafts=jnp.ones((input_ids.shape[0],), bool))

  def propose(self, request):
    state, history = request.state, request.history
    limit = request.limit
    if limit is None:
      limit = jnp.full(history.lengths.shape, request.static.gamma, jnp.int32)
    limit = jnp.where(history.done | ~state.drafts, 0, limit).astype(jnp.int32)
    proposal = self.inner.propose(request._replace(state=state.cache, limit=limit, some_row_drafts=False))
    return proposal.replace(after=_After(proposal.after, state.drafts))

  def propose_tree(self, params, state, history, static, knobs, keys):
    """A tree per row; a row not woken proposes junk (verified: exact) and does not set the catch-up's
    width (it counts as done there)."""
    quiet = dataclasses.replace(history, done=history.done | ~state.drafts)
    proposal = self.inner.propose_tree(params, state.cache, quiet, static, knobs, keys)
    return proposal.replace(after=_After(proposal.after, state.drafts))

  def idle(self, state, history, static):
    proposal = self.inner.idle(state.cache, history, static)
    return proposal.replace(after=_After(proposal.after, state.drafts))

  def state_axes(self) -> ServedDraftState:
    return ServedDraftState(cache=self.inner.state_axes(), drafts=("batch",))

  def settle(self, verdict) -> ServedDraftState:
    after = verdict.proposal.after
    cache = self.inner.settle(verdict._replace(proposal=verdict.proposal.replace(after=after.inner)))
    return ServedDraftState(cache=cache, drafts=after.drafts)


@dataclasses.dataclass(frozen=True)
class Deferred:
  """The insert program's drafter: `inner` (a `ModelDrafter` or a `ServedDraftModel`) whose `init` writes zeros
  of its state's shapes (a wrapped row's `drafts` False); the engine prefills the draft later (module
  docstring). Everything else is `inner`'s."""

  inner: Any

  @property
  def may_find_nothing(self) -> bool:
    return self.inner.may_find_nothing

  @property
  def default_cost(self) -> float:
    return self.inner.default_cost

  @property
  def feature_layers(self) -> tuple[int, ...]:
    return self.inner.feature_layers

  @property
  def reads_encoder(self) -> bool:
    return self.inner.reads_encoder

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None):
    shapes = jax.eval_shape(lambda: self.inner.init(params, input_ids, input_lengths, cache_len,
                                                    features=features, encoder=encoder))
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def state_axes(self):
    return self.inner.state_axes()

  def propose(self, request):
    return self.inner.propose(request)

  def idle(self, state, history, static):
    return self.inner.idle(state, history, static)

  def settle(self, verdict):
    return self.inner.settle(verdict)

  def propose_tree(self, params, state, history, static, knobs, keys):
    return self.inner.propose_tree(params, state, history, static, knobs, keys)
