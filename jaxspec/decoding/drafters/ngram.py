"""Prompt-lookup drafting: proposals copied from earlier in the context, without a draft model.

    out = jaxspec.generate(target, inputs, jaxspec.Speculation(jaxspec.NGramDraft(max_ngram=3), gamma=5))

Each iteration, for each row, the drafter looks for the context's last n tokens earlier in the context, trying
n = max_ngram first and down to min_ngram, takes the EARLIEST occurrence of the longest n that occurs (as
transformers' prompt lookup decoding does; the earliest has the most tokens after it) and proposes the up to
gamma tokens that followed it. The context is the input followed by the output so far: T5's source tokens, or a
decoder-only model's prompt (whose last token is the loop's first token, so it appears once). A row without a
match drafts nothing this iteration: for it, the iteration is plain decoding.

The proposals are deterministic, so q is one-hot on each proposed token: verification accepts x with probability
min(1, p(x) / 1) = p(x), and a rejection draws from the residual norm(max(0, p - onehot(x))) = p without x,
renormalised (`device.verify.accept_sampled` with q=None). At temperature 0 a proposal is kept while it equals the
target's argmax. Either way the output is the target's, exactly as with a draft model.

`jaxspec.NGramDraft` (settings.py) is the user's setting; `NGramDrafter` (here) the drafter it makes (device/drafter.py's
`Drafter`). Its state is an `NGramContext`: the input ids with the loop's cache_len positions of room after them, to which each iteration appends the tokens it emitted. The search is vectorised:
for each n (a static, small loop) n shifted comparisons of the whole [B, C] context.

Shape letters: B batch, S input positions, C = S + cache_len context positions, G = gamma.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding.drafters import tree
from jaxspec.decoding.device.drafter import Proposal, TreeProposal
from jaxspec.models.contract import write_rows

if TYPE_CHECKING:
  from jaxspec.decoding.settings import NGramDraft


@dataclasses.dataclass(frozen=True)
class NGramDrafter:
  """Prompt lookup behind the `Drafter` protocol (the loop's drafter for a `jaxspec.NGramDraft` setting, which
  checks the values; `registry.ngram_drafter` makes this from it). max_ngram / min_ngram: static, each pair compiles its own loop."""

  max_ngram: int = 3
  min_ngram: int = 1
  may_find_nothing: bool = True  # a row without a match proposes nothing
  default_cost: float = 0.0  # a lookup costs nothing next to a verify call
  feature_layers: tuple[int, ...] = ()  # reads no target features
  reads_encoder: bool = False  # nor an encoder's output

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None):
    return init_context(input_ids, input_lengths, cache_len)

  def propose(self, request):
    limit, state, static = request.limit, request.state, request.static
    if limit is None:
      limit = jnp.where(request.history.done, 0, static.gamma)
    tokens, found = propose(self, state, static.gamma)
    return Proposal(tokens=tokens, counts=jnp.minimum(found, limit).astype(jnp.int32), q=None, after=state)

  def idle(self, state, history, static):
    return Proposal.nothing(history, static, state)

  def state_axes(self):
    return NGramContext(tokens=("batch", "context"), lengths=("batch",))

  def settle(self, verdict):
    return append(verdict.proposal.after, verdict.block, verdict.emit)

  def propose_tree(self, params, state, history, static, knobs, keys):
    """The continuations of up to top_k earlier matches as branches of one tree (`propose_tree`)."""
    tokens, parents, depths, ancestors = propose_tree(self, state, history.last, static.gamma, static.tree.top_k,
                                                      static.tree.nodes)
    return TreeProposal(tokens=tokens, parents=parents, depths=depths, ancestors=ancestors, after=state)


@struct.dataclass
class NGramContext:
  """The drafter's state in the loop: every row's input followed by its output so far."""

  tokens: jax.Array  # [B, C] int32: input tokens, then the emitted tokens; junk at >= lengths.
  lengths: jax.Array  # [B] int32 valid tokens: input length + tokens emitted.


def init_context(input_ids: jax.Array, input_lengths: jax.Array, cache_len: int) -> NGramContext:
  """The context before the first iteration. input_ids: [B, S] right-padded; input_lengths: [B]."""
  tokens = jnp.pad(input_ids.astype(jnp.int32), ((0, 0), (0, cache_len)))  # [B, S + cache_len]
  return NGramContext(tokens=tokens, lengths=input_lengths.astype(jnp.int32))


def append(context: NGramContext, block: jax.Array, counts: jax.Array) -> NGramContext:
  """Appends block[b, :counts[b]] to each row. block: [B, T] with T <= the room left (the loop's slack)."""
  tokens = write_rows(context.tokens, block.astype(jnp.int32), context.lengths)
  return NGramContext(tokens=tokens, lengths=context.lengths + counts)


def _matches(tokens: jax.Array, lengths: jax.Array, n: int) -> jax.Array:
  """[B, C - n + 1] bool: an earlier occurrence of each row's last n tokens starts at i.

  An occurrence starting at i counts when a token follows it inside the context (i + n < lengths), which also
  excludes the suffix itself (it starts at lengths - n).
  """
  width = tokens.shape[1] - n + 1  # candidate starts i = 0 .. C - n
  suffix = jnp.take_along_axis(tokens, jnp.clip(lengths[:, None] - n + jnp.arange(n)[None], 0, None), axis=1)  # [B, n]
  match = jnp.arange(width)[None] + n < lengths[:, None]  # [B, width]
  for j in range(n):
    match &= tokens[:, j:j + width] == suffix[:, j:j + 1]
  return match


def _continuation_start(tokens: jax.Array, lengths: jax.Array, n: int) -> jax.Array:
  """[B] index of the token after the earliest earlier occurrence of each row's last n tokens, or -1."""
  match = _matches(tokens, lengths, n)
  return jnp.where(jnp.any(match, axis=1), jnp.argmax(match, axis=1) + n, -1).astype(jnp.int32)


def propose(draft: NGramDrafter | NGramDraft, context: NGramContext, gamma: int) -> tuple[jax.Array, jax.Array]:
  """Up to gamma proposed tokens per row: (tokens [B, G] (junk at >= counts), counts [B] int32 in [0, G])."""
  start = jnp.full(context.lengths.shape, -1, jnp.int32)
  for n in range(draft.max_ngram, draft.min_ngram - 1, -1):  # longest n first
    start = jnp.where(start < 0, _continuation_start(context.tokens, context.lengths, n), start)
  counts = jnp.where(start >= 0, jnp.minimum(gamma, context.lengths - start), 0).astype(jnp.int32)
  positions = jnp.clip(start[:, None] + jnp.arange(gamma)[None], 0, context.tokens.shape[1] - 1)
  return jnp.take_along_axis(context.tokens, positions, axis=1), counts


def _continuation_starts(tokens: jax.Array, lengths: jax.Array, n: int, k: int) -> jax.Array:
  """[B, K] indices of the tokens after the K earliest earlier occurrences of each row's last n tokens (-1 past
  the matches found), earliest first; as `_continuation_start`."""
  match = _matches(tokens, lengths, n)
  width = match.shape[1]
  score = jnp.where(match, -jnp.arange(width)[None], -width - 1)  # earliest first
  best, where = jax.lax.top_k(score, min(k, width))
  starts = jnp.where(best > -width - 1, where + n, -1).astype(jnp.int32)
  return jnp.pad(starts, ((0, 0), (0, k - starts.shape[1])), constant_values=-1)


def _first_distinct(starts: jax.Array, k: int) -> jax.Array:
  """[B, K] the first k distinct starts >= 0 of starts [B, M] (in order; -1 past them)."""
  m = starts.shape[1]
  earlier = jnp.tril(jnp.ones((m, m), bool), k=-1)  # [i, j]: j before i
  repeated = jnp.any((starts[:, :, None] == starts[:, None, :]) & earlier[None], axis=2)
  keep = (starts >= 0) & ~repeated
  order = jnp.argsort(~keep, axis=1, stable=True)[:, :k]  # kept ones first, in order
  return jnp.where(jnp.take_along_axis(keep, order, axis=1), jnp.take_along_axis(starts, order, axis=1), -1)


def propose_tree(draft: NGramDrafter | NGramDraft, context: NGramContext, root: jax.Array, gamma: int, top_k: int, nodes: int
                 ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """A lookup tree: the continuations (up to gamma tokens) of the top_k earliest matches of the longest suffixes
  (longer n first, then earlier; distinct positions), as branches from the root, common prefixes merged.

  Node 1 + k * gamma + d - 1 holds branch k's d-th token (branch-major: parents before children, siblings in
  match order); nodes beyond `nodes`, past a branch's end or repeating an earlier branch's prefix are unused
  (parent -1: never reached). N = 1 + min(nodes, top_k * gamma).

  Returns:
    tokens [B, N], parents [B, N], depths [B, N], ancestors [B, N, N] (`TreeProposal`'s fields).
  """
  batch = root.shape[0]
  found = [_continuation_starts(context.tokens, context.lengths, n, top_k)
           for n in range(draft.max_ngram, draft.min_ngram - 1, -1)]
  starts = _first_distinct(jnp.concatenate(found, axis=1), top_k)  # [B, K]
  positions = jnp.clip(starts[:, :, None] + jnp.arange(gamma)[None, None], 0, context.tokens.shape[1] - 1)
  branch = jnp.take_along_axis(context.tokens[:, None, :], positions, axis=2)  # [B, K, G]
  valid = (starts[:, :, None] >= 0) & (starts[:, :, None] + jnp.arange(gamma)[None, None] <
                                       context.lengths[:, None, None])  # [B, K, G]
  # same[b, k, c, d]: branches k and c agree (and are valid) on tokens 1..d
  agree = (branch[:, :, None] == branch[:, None, :]) & valid[:, :, None] & valid[:, None, :]
  same = jnp.cumprod(agree.astype(jnp.int32), axis=3).astype(bool)  # [B, K, K, G]
  first = jnp.argmax(same, axis=2)  # [B, K, G] the earliest branch with k's prefix through d (k itself at most)
  canonical = valid & (first == jnp.arange(top_k)[None, :, None])
  parent_branch = jnp.concatenate([jnp.zeros((batch, top_k, 1), jnp.int32), first[:, :, :-1]], axis=2)
  depth = jnp.broadcast_to(jnp.arange(1, gamma + 1, dtype=jnp.int32)[None, None], (batch, top_k, gamma))
  parent = jnp.where(depth == 1, 0, 1 + parent_branch * gamma + depth - 2)
  size = 1 + min(nodes, top_k * gamma)
  index = 1 + jnp.arange(top_k)[:, None] * gamma + jnp.arange(gamma)[None]  # [K, G] node index
  used = canonical & (index[None] < size)
  flat = lambda x, fill: jnp.concatenate([jnp.full((batch, 1), fill, x.dtype), x.reshape(batch, -1)], axis=1)[:, :size]
  tokens = flat(branch.astype(jnp.int32), 0).at[:, 0].set(root)
  parents = flat(jnp.where(used, parent, -1).astype(jnp.int32), -1)
  depths = flat(jnp.where(used, depth, 0), 0)
  return tokens, parents, depths, tree.ancestors_of(parents, gamma)
