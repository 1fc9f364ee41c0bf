"""Exact acceptance over a token tree (EAGLE-2, SpecInfer): which root-to-node path to keep, and the next token.

The target scored every node of a tree in one call (`TreeDecoder.step_tree`): node n's distribution p[:, n] is
the target's next-token distribution after the path root..n. Both rules walk down from the root (node 0, the
token the loop feeds first), trying the children of the current node in node order (a tree builder puts
siblings in decreasing draft score: `jaxspec.decoding.tree.build_tree`), and stop at a node where no child is
accepted; the next token then comes from that node. What they return, `TreeVerdict`, is what the loop needs:
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

from jaxspec.decoding import sampling


@struct.dataclass
class TreeVerdict:
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


def _walk(parents: jax.Array, path_size: int, choose) -> tuple[TreeVerdict, jax.Array]:
  """Walks down from the root: `choose(step, node [B]) -> (child [B], found [B] bool)`. Returns the verdict
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
  return TreeVerdict(path=path, path_len=length, next_token=jnp.zeros((batch,), jnp.int32)), node


def _path_size(parents: jax.Array, path_size: int | None) -> int:
  size = parents.shape[1] if path_size is None else int(path_size)
  if not 1 <= size <= parents.shape[1]:
    raise ValueError(f"path_size must be in [1, {parents.shape[1]}] (nodes), got {size}.")
  return size


def accept_tree_greedy(tokens: jax.Array, parents: jax.Array, target_logits: jax.Array,
                       path_size: int | None = None) -> TreeVerdict:
  """Temperature 0: from the root, move to the child equal to the target's argmax while there is one.

  Args:
    tokens: [B, N] int32 node tokens (node 0: the root, the loop's token).
    parents: [B, N] int32 parent node of each node (-1 at the root; -1 also for unused nodes, never reached).
      Parents come before children.
    target_logits: [B, N, V] (or probabilities): node n's predict the token after n's path.
    path_size: D, static, at least the deepest node's depth + 1 (default N).
  Returns:
    TreeVerdict; the emitted tokens tokens[path[1:path_len]] + [next_token] are plain greedy decoding's.
  """
  best = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, N]

  def choose(step, node):
    del step
    want = jnp.take_along_axis(best, node[:, None], axis=1)  # [B, 1]
    match = _children(parents, node) & (tokens == want)
    return jnp.argmax(match, axis=1).astype(jnp.int32), jnp.any(match, axis=1)

  verdict, last = _walk(parents, _path_size(parents, path_size), choose)
  return verdict.replace(next_token=jnp.take_along_axis(best, last[:, None], axis=1)[:, 0])


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
                        path_size: int | None = None) -> TreeVerdict:
  """Sampling: siblings as deterministic candidates, each tried against the residual left by those before it.

  Args:
    key: [B] PRNG keys, one per row (or a single key: the row index is then folded in).
    tokens: [B, N] int32 node tokens (node 0: the root); parents: [B, N] int32 as in `accept_tree_greedy`.
    p: [B, N, V] float32, the target's probabilities at every node after the sampling warp (exactly what plain
      sampling would draw from).
    path_size: D, static, at least the deepest node's depth + 1 (default N).
  Returns:
    TreeVerdict; the emitted tokens have the target's joint distribution (see the module docstring).
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

  verdict, last = _walk(parents, size, choose)
  p_last = jnp.take_along_axis(p, last[:, None, None], axis=1)[:, 0]
  residual = _residual(p_last, tokens, _children(parents, last))  # every child of the last node was rejected
  return verdict.replace(next_token=sampling.sample(sampling.fold(keys, size), residual))
