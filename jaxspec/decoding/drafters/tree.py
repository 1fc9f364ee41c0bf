"""Token trees: EAGLE-2's dynamic tree shape built from draft log-probabilities (the `jaxspec.Tree` setting that
shapes it is in settings.py; the `TreeProposal` a drafter hands the loop in device/drafter.py).

    tree = Tree(top_k=8, nodes=60)   # jaxspec.Speculation(draft, gamma=6, tree=tree): draft_tree grows it

EAGLE-2 (Li et al. 2024, arXiv 2406.16858) grows the tree by expected acceptance, estimated by the cumulative
draft log-probability of a node's path. Depth 1: the root's top_k tokens. Each further depth expands the
"beam", the top_k nodes of the previous depth by cumulative log-probability: each proposes its top_k children
(k^2 candidates), and the best top_k of those become the next beam. After D depths, every candidate ever
proposed is reranked by cumulative log-probability and the best `nodes` are kept. A child's score never exceeds
its parent's (log-probabilities are <= 0) and ties go to the earlier candidate, so every kept node's parent is
kept: the result is a tree.

The drafter and the builder alternate: `start` takes the root's draft log-probabilities, each `grow` the
log-probabilities the draft computed at the beam tokens `state.beam_tokens`, and `select` returns the tree
(tokens, parents, depths, ancestors) that `Decoder.step(..., tree=...)` and `tree_verify` take. `build_tree` chains
them over log-probabilities known in advance (tests, analysis). Static shapes throughout: a pool of
1 + k + (D - 1) k^2 candidates per row, filled depth by depth.

Sampled children (temperature > 0, with `keys`): each expanded node's k children are a SAMPLE without
replacement from the draft's q at that node, in draw order (the Gumbel-top-k trick: the k largest of
log q + Gumbel noise are the first k draws of sequential sampling without replacement), instead of q's top k.
Scores stay the cumulative log q of the path. `SampledSiblings` records, for every expanded node, its k draws
(kept in the tree or not) and q, which `tree_verify.accept_tree_recursive` needs to verify them by recursive
rejection sampling: lossless, and it accepts a draw with probability min(1, p/q) rather than p.

Shape letters: B rows, K top_k, V vocabulary, M candidates in the pool, N = nodes + 1 tree nodes (the root, node
0, is the loop's own token, not a draft), D depths (the tree's deepest node has depth D).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspec.decoding.device import sampling
from jaxspec.decoding.device.drafter import SampledSiblings, TreeProposal

if TYPE_CHECKING:
  from jaxspec.decoding.settings import Tree

@struct.dataclass
class TreeDraft:
  """The candidate pool while the tree grows. Pool slot 0 is the root; unfilled slots score -inf."""

  tokens: jax.Array  # [B, M] int32 candidate tokens.
  parents: jax.Array  # [B, M] int32 pool slot of each candidate's parent (-1: the root, unfilled slots).
  scores: jax.Array  # [B, M] float32 cumulative draft log-probability of the path (0 at the root).
  depths: jax.Array  # [B, M] int32.
  beam: jax.Array  # [B, K] int32 pool slots of the nodes the next `grow` expands, best first.
  filled: int = struct.field(pytree_node=False)  # Slots filled so far (static).

  @property
  def beam_tokens(self) -> jax.Array:
    """[B, K] int32: the tokens the draft must score next (its log-probabilities after each beam node's path)."""
    return jnp.take_along_axis(self.tokens, self.beam, axis=1)


def _children(logprobs: jax.Array, top_k: int, keys: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """(log q [..., K], tokens [..., K] int32) of a node's children from its log q [B, ..., V]: the top_k tokens,
  best first (keys None), or top_k draws without replacement from q, in draw order (Gumbel-top-k; keys [B])."""
  logprobs = logprobs.astype(jnp.float32)
  if keys is None:
    return jax.lax.top_k(logprobs, top_k)
  u = sampling.uniform(keys, logprobs.shape)
  _, tokens = jax.lax.top_k(logprobs - jnp.log(-jnp.log(u)), top_k)  # log q + Gumbel(0, 1) noise
  return jnp.take_along_axis(logprobs, tokens, axis=-1), tokens


def start(root_tokens: jax.Array, root_logprobs: jax.Array, top_k: int, depth: int,
          keys: jax.Array | None = None) -> TreeDraft:
  """Depth 1: the root's top_k tokens (or top_k draws from q with `keys` [B]: the module docstring).
  root_tokens [B] int32, root_logprobs [B, V]: the draft's log-probabilities of the first drafted token.
  `depth`: the expansions planned (sizes the pool)."""
  batch = root_tokens.shape[0]
  size = 1 + top_k + (depth - 1) * top_k ** 2
  scores, tokens = _children(root_logprobs, top_k, keys)  # [B, K]
  def pool(first, rest, fill, dtype):
    out = jnp.full((batch, size), fill, dtype)
    return out.at[:, :1 + top_k].set(jnp.concatenate([first.astype(dtype), rest.astype(dtype)], axis=1))
  zeros = jnp.zeros((batch, 1), jnp.int32)
  return TreeDraft(tokens=pool(root_tokens[:, None], tokens, 0, jnp.int32),
                   parents=pool(zeros - 1, jnp.zeros_like(tokens), -1, jnp.int32),
                   scores=pool(jnp.zeros((batch, 1)), scores, -jnp.inf, jnp.float32),
                   depths=pool(zeros, jnp.ones_like(tokens), 0, jnp.int32),
                   beam=jnp.broadcast_to(1 + jnp.arange(top_k, dtype=jnp.int32), (batch, top_k)),
                   filled=1 + top_k)


def grow(state: TreeDraft, beam_logprobs: jax.Array, keys: jax.Array | None = None) -> TreeDraft:
  """One more depth: each beam node proposes its top_k children (k^2 candidates, in beam order, then child rank;
  with `keys` [B], its top_k draws from q in draw order); the best top_k by cumulative log-probability become the
  beam. beam_logprobs [B, K, V]: the draft's log-probabilities after each beam node's path."""
  batch, k = state.beam.shape
  logp, child = _children(beam_logprobs, k, keys)  # [B, K, K]
  parent_scores = jnp.take_along_axis(state.scores, state.beam, axis=1)  # [B, K]
  scores = (parent_scores[:, :, None] + logp).reshape(batch, k * k)
  parents = jnp.broadcast_to(state.beam[:, :, None], (batch, k, k)).reshape(batch, k * k)
  depth = jnp.take_along_axis(state.depths, state.beam[:, :1], axis=1) + 1  # [B, 1]: the beam shares a depth
  at = state.filled
  _, best = jax.lax.top_k(scores, k)  # [B, K] best first; ties to the earlier candidate
  return TreeDraft(tokens=state.tokens.at[:, at:at + k * k].set(child.reshape(batch, k * k).astype(jnp.int32)),
                   parents=state.parents.at[:, at:at + k * k].set(parents),
                   scores=state.scores.at[:, at:at + k * k].set(scores),
                   depths=state.depths.at[:, at:at + k * k].set(jnp.broadcast_to(depth, (batch, k * k))),
                   beam=(at + best).astype(jnp.int32), filled=at + k * k)


def select(state: TreeDraft, nodes: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The root and the best `nodes` candidates by cumulative log-probability, in pool order (parents before
  children, siblings by draft score).

  Returns:
    tokens [B, N] int32, parents [B, N] int32 (node indices; -1 at the root), depths [B, N] int32 and
    ancestors [B, N, N] bool (a node is its own ancestor), N = nodes + 1.
  """
  slots, node_of_slot = _kept(state, nodes)
  parent_slots = jnp.take_along_axis(state.parents, slots, axis=1)  # [B, N]
  parents = jnp.where(parent_slots < 0, -1, jnp.take_along_axis(node_of_slot, jnp.maximum(parent_slots, 0), axis=1))
  tokens = jnp.take_along_axis(state.tokens, slots, axis=1)
  depths = jnp.take_along_axis(state.depths, slots, axis=1)
  k = state.beam.shape[1]
  return tokens, parents, depths, ancestors_of(parents, 1 + (state.filled - 1 - k) // (k * k))


def _kept(state: TreeDraft, nodes: int) -> tuple[jax.Array, jax.Array]:
  """(slots [B, N] int32: the pool slots of the root and the best `nodes` candidates, in pool order;
  node_of_slot [B, M] int32: each pool slot's tree node, -1 where not kept)."""
  batch, size = state.tokens.shape
  if not 1 <= nodes <= state.filled - 1:
    raise ValueError(f"select {nodes} nodes from {state.filled - 1} candidates.")
  _, best = jax.lax.top_k(state.scores[:, 1:], nodes)  # [B, nodes] pool slots - 1
  slots = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), jnp.sort(best, axis=1).astype(jnp.int32) + 1], axis=1)
  rows = jnp.arange(batch)[:, None]
  node_of_slot = jnp.full((batch, size), -1, jnp.int32).at[rows, slots].set(jnp.arange(nodes + 1, dtype=jnp.int32))
  return slots, node_of_slot


def _siblings(pool: TreeDraft, expanded: list[jax.Array], logprobs: list[jax.Array], nodes: int) -> SampledSiblings:
  """SampledSiblings of a grown pool: expanded [B, 1] (the root) then [B, K] per depth (that depth's beam slots);
  logprobs [B, V] then [B, K, V] per depth, q's logs there. A beam's children fill k consecutive slots each, in
  beam order, from the slot where its `grow` started."""
  k = pool.beam.shape[1]
  _, node_of_slot = _kept(pool, nodes)
  slots = jnp.concatenate(expanded, axis=1)  # [B, E]
  starts = [1] + [1 + k + d * k * k for d in range(len(expanded) - 1)]
  child_slots = np.concatenate([s + np.arange(e.shape[1] * k).reshape(e.shape[1], k)
                                for s, e in zip(starts, expanded)])  # [E, K], static
  batch = slots.shape[0]
  child_slots = jnp.broadcast_to(jnp.asarray(child_slots, jnp.int32), (batch,) + child_slots.shape)
  flat = child_slots.reshape(batch, -1)
  q = jnp.exp(jnp.concatenate([logprobs[0][:, None]] + list(logprobs[1:]), axis=1).astype(jnp.float32))
  return SampledSiblings(nodes=jnp.take_along_axis(node_of_slot, slots, axis=1),
                         children=jnp.take_along_axis(pool.tokens, flat, axis=1).reshape(child_slots.shape),
                         child_nodes=jnp.take_along_axis(node_of_slot, flat, axis=1).reshape(child_slots.shape),
                         q=q)


def ancestors_of(parents: jax.Array, max_depth: int) -> jax.Array:
  """[B, N, N] bool ancestor mask (itself included) of parents [B, N] (-1 at roots), by following parents
  max_depth times (>= the deepest node's depth)."""
  batch, n = parents.shape
  eye = jnp.broadcast_to(jnp.eye(n, dtype=bool), (batch, n, n))
  has_parent = (parents >= 0)[:, :, None]

  def body(_, anc):
    from_parent = jnp.take_along_axis(anc, jnp.maximum(parents, 0)[:, :, None], axis=1)  # [B, N, N] parent's row
    return eye | (has_parent & from_parent)

  return jax.lax.fori_loop(0, max_depth, body, eye)


def build_tree(root_tokens: jax.Array, logprobs: list[jax.Array], tree: Tree
               ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """EAGLE-2's tree from draft log-probabilities known in advance: logprobs[0] [B, V] at the root, logprobs[d]
  [B, K, V] at the beam of depth d (beam order: `TreeDraft.beam`, best first). D = len(logprobs) depths.
  Returns (tokens, parents, depths, ancestors) as `select`."""
  depth = len(logprobs)
  tree.check_depth(depth)
  state = start(root_tokens, logprobs[0], tree.top_k, depth)
  for lp in logprobs[1:]:
    state = grow(state, lp)
  return select(state, tree.nodes)


def draft_tree(root_tokens: jax.Array, root_logprobs: jax.Array, beam_step: Callable, state: Any, tree: Tree,
               depth: int, keys: jax.Array | None = None) -> TreeProposal:
  """EAGLE-2's tree grown by a drafter that scores the beam depth by depth, each beam node fed once.

  Depth 1 comes from the root's log-probabilities; then, for each depth d = 1 .. depth - 1, the K beam nodes of
  depth d are fed in one call, `beam_step(state, tokens [B, K], depths [B, P + K], ancestors [B, K, P + K])
  -> (logprobs [B, K, V], state)`, where the P = K (d - 1) earlier columns are the beams fed before (depth 1
  first) and depths count from 0 at depth 1 (the call's first tree slot; `Decoder.step(..., tree=...)` with earlier
  nodes). Every candidate's parent is a beam node of the depth above, so a beam node's ancestors are all fed.
  Unrolled over depths (each call has its own static width); depth - 1 calls of K tokens in all.

  Args:
    root_tokens: [B] int32 the loop's last token; root_logprobs: [B, V] the drafter's log-probabilities after it.
    depth: D expansions (the speculation's gamma, static); tree.check_depth(depth) must hold.
    keys: None (children: the top_k of q), or [B] keys: children drawn from q = exp(logprobs) without
      replacement, recorded in the proposal's `siblings` (the module docstring).
  Returns:
    TreeProposal (tokens, parents, depths, ancestors as `select`; after: the state after the last call).
  """
  k = tree.top_k
  key_at = (lambda d: None) if keys is None else (lambda d: sampling.fold(keys, d))
  pool = start(root_tokens, root_logprobs, k, depth, key_at(0))
  batch = root_tokens.shape[0]
  expanded, logprobs_seen = [jnp.zeros((batch, 1), jnp.int32)], [root_logprobs]
  eye = jnp.broadcast_to(jnp.eye(k, dtype=bool), (batch, k, k))
  rows, fed_depths, previous = eye, jnp.zeros((batch, k), jnp.int32), None  # ancestors of the beam over fed nodes
  for d in range(1, depth):
    if previous is not None:
      parent_slots = jnp.take_along_axis(pool.parents, pool.beam, axis=1)  # [B, K]
      parent = jnp.argmax(parent_slots[:, :, None] == previous[:, None, :], axis=2)  # [B, K] index in old beam
      inherited = jnp.take_along_axis(rows, parent[:, :, None], axis=1)  # [B, K, P]
      rows = jnp.concatenate([inherited, eye], axis=2)
      fed_depths = jnp.concatenate([fed_depths, jnp.full((batch, k), d - 1, jnp.int32)], axis=1)
    logprobs, state = beam_step(state, pool.beam_tokens, fed_depths, rows)
    previous = pool.beam
    expanded.append(pool.beam)
    logprobs_seen.append(logprobs)
    pool = grow(pool, logprobs, key_at(d))
  tokens, parents, depths, ancestors = select(pool, tree.nodes)
  siblings = None if keys is None else _siblings(pool, expanded, logprobs_seen, tree.nodes)
  return TreeProposal(tokens=tokens, parents=parents, depths=depths, ancestors=ancestors, after=state,
                      siblings=siblings)


def draft_logprobs(logits: jax.Array, greedy: bool, filtering: bool, knobs: sampling.SamplingKnobs) -> jax.Array:
  """[..., V] the draft's log-probabilities that rank a tree's candidates: of the raw logits at temperature 0,
  else of the warped distribution the target samples from (tokens it filters out score -inf). Any ranking keeps
  the output exact (the tree depends on the draft only); this one tries what sampling would draw."""
  if greedy:
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.log(sampling.warp_probs(logits, knobs, filtering))
