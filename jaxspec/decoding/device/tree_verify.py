"""Exact acceptance over a token tree (EAGLE-2, SpecInfer): which root-to-node path to keep, and the next token.

The target scored every node of a tree in one call (`Decoder.step(..., tree=...)`): node n's distribution p[:, n] is
the target's next-token distribution after the path root..n. Both rules walk down from the root (node 0, the
token the loop feeds first), trying the children of the current node in node order (a tree builder puts
siblings in decreasing draft score: `jaxspec.decoding.drafters.tree.build_tree`), and stop at a node where no child is
accepted; the next token then comes from that node. What they return, `TreeAcceptance`, is what the loop needs:
the path (for `cache.compact(base, path, path_len)` and the emitted tokens tokens[path[1:]]) and the next token.

Greedy (`accept_tree_greedy`): move to the child whose token is the target's argmax; the next token is the
argmax at the node where that child is missing. The emitted tokens are those of plain greedy decoding.

Sampling (`accept_tree_sampled`): each sibling is a deterministic candidate (its q is one-hot; Leviathan's rule
with q one-hot accepts x with probability p(x) and leaves the residual p without x). At the current node, with
the residual r = p of that node: for each child x in order, accept with probability r(x) / sum(r); on rejection
set r(x) = 0 and try the next child; on acceptance move to that child (r = its p). If every child is rejected,
sample the next token from r. Why this keeps the target's distribution exactly: by induction on the number k of
candidates at a node, the emitted token is distributed as r. For k = 0 it is drawn from r. For k >= 1, the first
candidate x is emitted with probability r(x) / |r| (|r| the mass); otherwise (probability 1 - r(x) / |r|) the
procedure runs on r without x, which by induction emits y != x with probability r(y) / (|r| - r(x)): in all,
y with probability (1 - r(x) / |r|) r(y) / (|r| - r(x)) = r(y) / |r|. So the first token after each node is
drawn from the target's p at that node, and moving to the accepted child conditions the next one on it, as the
target does: the emitted sequence has the target's joint distribution, however the siblings were chosen, as
long as the tree was chosen from draft information only (never from the target's verdict). A second sibling
with the same token has r(x) = 0 by then and is never accepted.

Sampled children (`accept_tree_recursive`): when the drafter DREW each expanded node's K children from its q
without replacement (x_1 .. x_K in draw order; `drafter.SampledSiblings`), recursive rejection sampling (Jeon et
al. 2024, "Recursive Speculative Decoding") accepts more: with r = p at the node and q_1 = q, accept x_i with
probability min(1, r_i(x_i) / q_i(x_i)); on rejection r_{i+1} = norm(max(0, r_i - q_i)) and q_{i+1} = q_i
without x_i, renormalised; when every draw is rejected, the next token comes from r_{K+1}. Each stage is
Leviathan's rule with proposal q_i (the law of x_i given the earlier draws) and target r_i, which does not depend
on the earlier draws, so it emits r_i exactly; r_{i+1}(x_i) = 0 (a rejection needs q_i(x_i) > r_i(x_i)), so the
residual never needs x_i again: by induction the emitted token is distributed as p. An accepted draw that the
tree kept moves the walk to its node; one that the final rerank dropped ends the path with it as the next
token (its target distribution was not computed, nothing more is needed); at a node that was not expanded the
next token is drawn from p. Top-k drafting with this acceptance (EAGLE's temperature > 0 rule) is NOT exact:
the draws must come from q, and the tests show the difference.

Arithmetic: r is kept unnormalised (p with rejected tokens zeroed; the test is u * |r| < r(x), no division),
so no renormalised rounding noise is ever sampled from (REFERENCE.md pitfall 2); `sampling.sample` normalises by
the mass it sees. Only if rounding zeroed every entry (a rejection of probability ~1e-7) is p itself used.

Shapes: B rows, N tree nodes, D path slots (>= the deepest node's depth + 1), V vocabulary. Static shapes
throughout; one `lax.fori_loop` over D steps, vectorised over the rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding.device import sampling
from jaxspec.decoding.device.drafter import SampledSiblings
from jaxspec.decoding.device.verify import residual_probs


@struct.dataclass
class TreeAcceptance:
  path: jax.Array  # [B, D] int32 node indices of the kept path, root (0) first; 0 past path_len.
  path_len: jax.Array  # [B] int32 nodes on the path, root included (>= 1): accepted drafts + 1.
  next_token: jax.Array  # [B] int32: the correction (every child of the last node rejected) or the bonus token.

  @property
  def num_accepted(self) -> jax.Array:
    """[B] int32 drafted nodes accepted (the root is the loop's own token, not a draft)."""
    return self.path_len - 1


def _children(parents: jax.Array, node: jax.Array) -> jax.Array:
  """[B, N] bool: the children of node [B] (parents [B, N], -1 at the root and at unused nodes)."""
  return parents == node[:, None]


def _walk(parents: jax.Array, path_size: int, choose) -> tuple[TreeAcceptance, jax.Array]:
  """Walks down from the root: `choose(step, node [B]) -> (child [B], found [B] bool)`. Returns the acceptance
  without next_token (zeros) and the last node [B]."""
  batch = parents.shape[0]

  def body(step, carry):
    node, alive, path, length = carry
    child, found = choose(step, node)
    move = alive & found
    node = jnp.where(move, child, node)
    path = path.at[:, step + 1].set(jnp.where(move, child, 0))
    return node, move, path, length + move.astype(jnp.int32)

  start = (jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool), jnp.zeros((batch, path_size), jnp.int32),
           jnp.ones((batch,), jnp.int32))
  node, _, path, length = jax.lax.fori_loop(0, path_size - 1, body, start)
  return TreeAcceptance(path=path, path_len=length, next_token=jnp.zeros((batch,), jnp.int32)), node


def _path_size(parents: jax.Array, path_size: int | None) -> int:
  size = parents.shape[1] if path_size is None else int(path_size)
  if not 1 <= size <= parents.shape[1]:
    raise ValueError(f"path_size must be in [1, {parents.shape[1]}] (nodes), got {size}.")
  return size


def accept_tree_greedy(tokens: jax.Array, parents: jax.Array, target_logits: jax.Array,
                       path_size: int | None = None) -> TreeAcceptance:
  """Temperature 0: from the root, move to the child equal to the target's argmax while there is one.

  Args:
    tokens: [B, N] int32 node tokens (node 0: the root, the loop's token).
    parents: [B, N] int32 parent node of each node (-1 at the root; -1 also for unused nodes, never reached).
      Parents come before children.
    target_logits: [B, N, V] (or probabilities): node n's predict the token after n's path.
    path_size: D, static, at least the deepest node's depth + 1 (default N).
  Returns:
    TreeAcceptance; the emitted tokens tokens[path[1:path_len]] + [next_token] are plain greedy decoding's.
  """
  best = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, N]

  def choose(step, node):
    del step
    want = jnp.take_along_axis(best, node[:, None], axis=1)  # [B, 1]
    match = _children(parents, node) & (tokens == want)
    return jnp.argmax(match, axis=1).astype(jnp.int32), jnp.any(match, axis=1)

  acceptance, last = _walk(parents, _path_size(parents, path_size), choose)
  return acceptance.replace(next_token=jnp.take_along_axis(best, last[:, None], axis=1)[:, 0])


def _first_candidates(tokens: jax.Array, candidate: jax.Array) -> jax.Array:
  """[B, N] bool: candidate nodes whose token no earlier candidate (in node order) carries."""
  same = tokens[:, :, None] == tokens[:, None, :]  # [B, N, N]: [b, n, m] tokens of n and m equal
  earlier = jnp.tril(jnp.ones(same.shape[1:], bool), k=-1)  # [N, N]: m < n
  repeated = jnp.any(same & earlier[None] & candidate[:, None, :], axis=2)
  return candidate & ~repeated


def _mass_when_tried(p_node: jax.Array, p_x: jax.Array) -> jax.Array:
  """[B, N] |r| when candidate n is tried: the node's mass (p_node [B, V]) less that of the earlier candidates
  (p_x [B, N]: p(x) of each candidate, 0 elsewhere), all rejected by then."""
  removed_before = jnp.cumsum(p_x, axis=1) - p_x
  return jnp.sum(p_node, axis=1, keepdims=True) - removed_before


def _residual(p_node: jax.Array, tokens: jax.Array, rejected: jax.Array) -> jax.Array:
  """p at a node [B, V] with the tokens of the rejected children (rejected [B, N] bool) zeroed, unnormalised;
  p itself where rounding left no mass at all."""
  rows = jnp.arange(p_node.shape[0])[:, None]
  r = p_node.at[rows, tokens].multiply(jnp.where(rejected, 0.0, 1.0).astype(p_node.dtype))
  return jnp.where(jnp.sum(r, axis=-1, keepdims=True) > 0, r, p_node)


def accept_tree_sampled(key: jax.Array, tokens: jax.Array, parents: jax.Array, p: jax.Array,
                        path_size: int | None = None) -> TreeAcceptance:
  """Sampling: siblings as deterministic candidates, each tried against the residual left by those before it.

  Args:
    key: [B] PRNG keys, one per row (or a single key: the row index is then folded in).
    tokens: [B, N] int32 node tokens (node 0: the root); parents: [B, N] int32 as in `accept_tree_greedy`.
    p: [B, N, V] float32, the target's probabilities at every node after the sampling warp (exactly what plain
      sampling would draw from).
    path_size: D, static, at least the deepest node's depth + 1 (default N).
  Returns:
    TreeAcceptance; the emitted tokens have the target's joint distribution (see the module docstring).
  """
  batch = tokens.shape[0]
  keys = sampling.row_keys(key, batch)
  size = _path_size(parents, path_size)
  p = p.astype(jnp.float32)

  def choose(step, node):
    p_node = jnp.take_along_axis(p, node[:, None, None], axis=1)[:, 0]  # [B, V]
    candidate = _first_candidates(tokens, _children(parents, node))
    p_x = jnp.where(candidate, jnp.take_along_axis(p_node, tokens, axis=1), 0.0)  # [B, N] r(x) before removals
    mass = _mass_when_tried(p_node, p_x)
    u = sampling.uniform(sampling.fold(keys, step), (batch, tokens.shape[1]))
    accept = candidate & (u * mass < p_x)
    return jnp.argmax(accept, axis=1).astype(jnp.int32), jnp.any(accept, axis=1)

  acceptance, last = _walk(parents, size, choose)
  p_last = jnp.take_along_axis(p, last[:, None, None], axis=1)[:, 0]
  residual = _residual(p_last, tokens, _children(parents, last))  # every child of the last node was rejected
  return acceptance.replace(next_token=sampling.sample(sampling.fold(keys, size), residual))


def _normalised(x: jax.Array) -> jax.Array:
  """x / sum(x) over the last axis; zeros where the sum is 0."""
  mass = jnp.sum(x, axis=-1, keepdims=True)
  return jnp.where(mass > 0, x / jnp.where(mass > 0, mass, 1.0), 0.0)


def _recursive_rejection(u: jax.Array, p_node: jax.Array, q: jax.Array, children: jax.Array,
                         child_nodes: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """One node of recursive rejection sampling (the module docstring).

  Args:
    u: [B, K] uniforms; p_node: [B, V] the target's p at the node; q: [B, V] the draft's q there (all zero at a
      node that was not expanded: every draw is then invalid); children: [B, K] the draws in draw order;
      child_nodes: [B, K] their tree nodes (-1: not in the tree).
  Returns:
    (accepted [B] bool, token [B] int32 the accepted draw, node [B] int32 its tree node or -1, residual [B, V]
    r_{K+1}, what the next token is drawn from when nothing was accepted).
  """
  batch, k = children.shape
  rows = jnp.arange(batch)
  r, qq = _normalised(p_node.astype(jnp.float32)), _normalised(q.astype(jnp.float32))
  accepted, token, node = jnp.zeros((batch,), bool), jnp.zeros((batch,), jnp.int32), jnp.full((batch,), -1, jnp.int32)

  def body(i, carry):
    r, qq, accepted, token, node = carry
    x = children[:, i]
    qx, rx = qq[rows, x], r[rows, x]
    tried = ~accepted & (qx > 0)  # a draw with q = 0 (rounding, filtering) was never really drawn: skipped
    take = tried & (u[:, i] * qx < rx)
    rejected = (tried & ~take)[:, None]
    r = jnp.where(rejected, residual_probs(r, qq), r)
    qq = jnp.where(rejected, _normalised(qq.at[rows, x].set(0.0)), qq)
    return (r, qq, accepted | take, jnp.where(take, x, token), jnp.where(take, child_nodes[:, i], node))

  r, _, accepted, token, node = jax.lax.fori_loop(0, k, body, (r, qq, accepted, token, node))
  return accepted, token, node, r


def _expanded_node(siblings: SampledSiblings, node: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(q [B, V] (zero where `node` [B] was not expanded), children [B, K], child_nodes [B, K]) of node."""
  hit = siblings.nodes == node[:, None]  # [B, E]
  e = jnp.argmax(hit, axis=1)
  q = jnp.take_along_axis(siblings.q, e[:, None, None], axis=1)[:, 0]
  q = jnp.where(jnp.any(hit, axis=1)[:, None], q, 0.0)
  pick = lambda x: jnp.take_along_axis(x, e[:, None, None], axis=1)[:, 0]
  return q, pick(siblings.children), pick(siblings.child_nodes)


def accept_tree_recursive(key: jax.Array, tokens: jax.Array, parents: jax.Array, p: jax.Array,
                          siblings: SampledSiblings, path_size: int | None = None) -> TreeAcceptance:
  """Sampling over a tree whose children were drawn from the draft's q: recursive rejection sampling.

  Args:
    key: [B] PRNG keys, one per row (or a single key: the row index is then folded in).
    tokens, parents: [B, N] as in `accept_tree_greedy`; p: [B, N, V] float32 the target's warped
      probabilities at every node; siblings: the draws and q of every expanded node (`tree.draft_tree` with keys).
    path_size: D, static, at least the deepest node's depth + 1 (default N).
  Returns:
    TreeAcceptance; the emitted tokens have the target's joint distribution (the module docstring).
  """
  batch = tokens.shape[0]
  keys = sampling.row_keys(key, batch)
  size = _path_size(parents, path_size)
  k = siblings.children.shape[2]
  p = p.astype(jnp.float32)

  def body(step, carry):
    node, alive, path, length, next_token = carry
    p_node = jnp.take_along_axis(p, node[:, None, None], axis=1)[:, 0]  # [B, V]
    q, children, child_nodes = _expanded_node(siblings, node)
    step_keys = sampling.fold(keys, step)
    u = sampling.uniform(sampling.fold(step_keys, 0), (batch, k))
    accepted, token, child, residual = _recursive_rejection(u, p_node, q, children, child_nodes)
    drawn = sampling.sample(sampling.fold(step_keys, 1), residual)
    move = alive & accepted & (child >= 0)
    stop = alive & ~move
    next_token = jnp.where(stop, jnp.where(accepted, token, drawn), next_token)
    path = path.at[:, jnp.minimum(step + 1, size - 1)].set(jnp.where(move, child, path[:, jnp.minimum(step + 1,
                                                                                                     size - 1)]))
    return jnp.where(move, child, node), move, path, length + move.astype(jnp.int32), next_token

  start = (jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool), jnp.zeros((batch, size), jnp.int32),
           jnp.ones((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32))
  _, _, path, length, next_token = jax.lax.fori_loop(0, size, body, start)
  return TreeAcceptance(path=path, path_len=length, next_token=next_token)
