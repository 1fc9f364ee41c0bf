"""`Eagle3Head.step_tree` (a feature head growing a token tree; docs/trees.md, "Trees from a feature head"): a
chain tree is `step`; each node of a branching tree, fed depth by depth as `HeadDrafter.propose_tree` feeds its
beams, gets the logits and pre-norm output of `step` fed that node's path (each entry with its own hidden)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.models import eagle3
from jaxspec.models.contract import TreeNodes

from test_tree_step import path_to, tree_arrays

V, H, F = 16, 32, 3 * 24
CFG = eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=12, hidden_size=H, target_hidden_size=24,
                          intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8)
# Row 0: two children of the root, two under node 1, then depth 3; row 1: a chain under node 2.
PARENTS = np.array([[-1, 0, 0, 1, 1, 3], [-1, 0, 0, 2, 3, 4]], np.int32)


def _step(head, params, embed, cache, hidden, tokens, tree=None):
  """(logits, prenorm, cache) of the head's `Decoder.step` (a chain, or tree nodes with `tree`)."""
  res = head.step({"head": params, "embed": embed}, cache, eagle3.HeadInput(tokens, hidden), tree=tree)
  return res.logits, res.features, res.cache


def _step_tree(head, params, embed, cache, hidden, tokens, depths, ancestors):
  return _step(head, params, embed, cache, hidden, tokens, tree=TreeNodes(depths, ancestors))


def _setup():
  """(head, params, embed, a cache with ragged prompt prefills of 5 and 8 entries, hidden [B, N, H])."""
  head = eagle3.Eagle3Head(CFG)
  params = eagle3.init_params(CFG, jax.random.PRNGKey(0), std=0.3)
  rng = np.random.RandomState(0)
  embed = jnp.asarray(rng.randn(V, H), jnp.float32)
  features = jnp.asarray(rng.randn(2, 9, F), jnp.float32)
  ids = jnp.asarray(rng.randint(0, V, size=(2, 9)), jnp.int32)
  cache = eagle3.prefill(params, CFG, embed, features, ids, jnp.asarray([6, 9], jnp.int32), 16)
  hidden = jnp.asarray(rng.randn(2, PARENTS.shape[1], H), jnp.float32)
  return head, params, embed, cache, hidden


def test_a_chain_tree_is_step():
  head, params, embed, cache, hidden = _setup()
  tokens = jnp.asarray(np.random.RandomState(1).randint(0, V, size=(2, 4)), jnp.int32)
  depths = jnp.broadcast_to(jnp.arange(4, dtype=jnp.int32), (2, 4))
  ancestors = jnp.broadcast_to(jnp.tril(jnp.ones((4, 4), bool)), (2, 4, 4))
  want = _step(head, params, embed, cache, hidden[:, :4], tokens)
  got = _step_tree(head, params, embed, cache, hidden[:, :4], tokens, depths, ancestors)
  for g, w in zip(got[:2], want[:2]):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[2].lengths, want[2].lengths)
  np.testing.assert_allclose(got[2].k, want[2].k, rtol=1e-5, atol=1e-5)


def test_each_node_sees_its_path_when_fed_depth_by_depth():
  """Nodes fed in one call per depth (earlier depths as the P earlier nodes): node n's logits and pre-norm output
  are those of `step` fed n's path (entry j of the path with its own hidden), in both rows; without the earlier
  nodes (negative control) they differ."""
  head, params, embed, cache, hidden = _setup()
  depths, ancestors = tree_arrays(PARENTS)
  tokens = jnp.asarray(np.random.RandomState(2).randint(0, V, size=PARENTS.shape), jnp.int32)
  cuts = [0, 1, 3, 5, 6]  # calls: node 0, nodes 1-2, nodes 3-4, node 5 (row 0's depths; row 1's node 4 is a
  #                        child of node 3 in the same call)
  logits, prenorm, c = [], [], cache
  for a, b in zip(cuts[:-1], cuts[1:]):
    lg, pn, c = _step_tree(head, params, embed, c, hidden[:, a:b], tokens[:, a:b], jnp.asarray(depths[:, :b]),
                               jnp.asarray(ancestors[:, a:b, :b]))
    logits.append(lg)
    prenorm.append(pn)
  logits, prenorm = jnp.concatenate(logits, axis=1), jnp.concatenate(prenorm, axis=1)
  np.testing.assert_array_equal(c.lengths, cache.lengths + PARENTS.shape[1])
  # `step` of each row alone (its cache sliced to the row) fed the node's path.
  for node in range(PARENTS.shape[1]):
    for r in range(2):
      path = path_to(PARENTS[r], node)
      row = jax.tree.map(lambda x: x[r:r + 1], cache)
      want_logits, want_prenorm, _ = _step(head, params, embed, row, hidden[r:r + 1, path], tokens[r:r + 1, path])
      np.testing.assert_allclose(prenorm[r, node], want_prenorm[0, -1], rtol=1e-4, atol=1e-4,
                                 err_msg=f"node {node} row {r}")
      np.testing.assert_allclose(logits[r, node], want_logits[0, -1], rtol=1e-4, atol=1e-4)
  alone = _step_tree(head, params, embed, cache, hidden[:, 3:5], tokens[:, 3:5], jnp.asarray(depths[:, 3:5]),
                         jnp.asarray(ancestors[:, 3:5, 3:5]))[1]
  assert not np.allclose(alone, prenorm[:, 3:5], rtol=1e-3, atol=1e-3)
