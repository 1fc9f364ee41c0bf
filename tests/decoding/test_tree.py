"""The `Tree` setting (settings.py) and EAGLE-2's tree builder (jaxspec/decoding/drafters/tree.py), on a hand-made
example."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.decoding import settings
from jaxspec.decoding.drafters import tree as tr
from jaxspec.errors import SettingsError

V = 6


@pytest.fixture(autouse=True)
def strict_ranks():
  with jax.numpy_rank_promotion("raise"):
    yield


def test_tree_setting_is_checked_and_frozen():
  t = settings.Tree(top_k=np.int64(4), nodes=20)
  assert (t.top_k, t.nodes) == (4, 20) and type(t.top_k) is int
  with pytest.raises(dataclasses.FrozenInstanceError):
    t.nodes = 3  # type: ignore[misc]
  for kwargs, field in ((dict(top_k=0), "top_k"), (dict(top_k=settings.MAX_TOP_K + 1), "top_k"), (dict(top_k=2.0), "top_k"),
                        (dict(top_k=True), "top_k"), (dict(nodes=0), "nodes"), (dict(nodes="60"), "nodes"),
                        (dict(nodes=settings.MAX_NODES + 1), "nodes")):
    with pytest.raises(SettingsError, match=f"Tree.{field} must be an integer"):
      settings.Tree(**kwargs)
  settings.Tree(top_k=2, nodes=6).check_depth(2)  # 2 + 4 candidates
  with pytest.raises(SettingsError, match="depth 1 proposes 2"):
    settings.Tree(top_k=2, nodes=6).check_depth(1)


def _logprobs(rows: list[dict[int, float]]) -> np.ndarray:
  """[len(rows), V] log-probabilities: the given tokens' probabilities, every other token far below (distinct)."""
  out = -30.0 - np.arange(V, dtype=np.float32)[None].repeat(len(rows), 0)
  for r, probs in enumerate(rows):
    for tok, prob in probs.items():
      out[r, tok] = np.log(prob)
  return out


# top_k 2, 3 depths. Pool slots (cumulative probability): root 0 (token 0); depth 1: s1 token 2 (.6), s2 token 3
# (.25); depth 2 (beam s1, s2): s3 token 4 (.30), s4 token 5 (.24) under s1, s5 token 4 (.225), s6 token 1
# (.0125) under s2; beam s3, s4 (siblings); depth 3: s7 token 1 (.21), s8 token 0 (.06) under s3, s9 token 2
# (.12), s10 token 3 (.072) under s4.
LOGPROBS = [_logprobs([{2: .6, 3: .25}])[:, None],
            _logprobs([{4: .5, 5: .4}, {4: .9, 1: .05}])[None],
            _logprobs([{1: .7, 0: .2}, {2: .5, 3: .3}])[None]]


def test_grow_keeps_the_best_beam():
  state = tr.start(jnp.asarray([0]), jnp.asarray(LOGPROBS[0][:, 0]), top_k=2, depth=3)
  np.testing.assert_array_equal(state.beam_tokens, [[2, 3]])
  state = tr.grow(state, jnp.asarray(LOGPROBS[1]))
  np.testing.assert_array_equal(state.beam, [[3, 4]])  # both children of s1: .30 and .24 beat .225
  np.testing.assert_array_equal(state.beam_tokens, [[4, 5]])
  state = tr.grow(state, jnp.asarray(LOGPROBS[2]))
  assert state.filled == 11
  np.testing.assert_array_equal(state.parents, [[-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]])
  np.testing.assert_allclose(np.exp(state.scores), [[1, .6, .25, .30, .24, .225, .0125, .21, .06, .12, .072]],
                             rtol=1e-5)


@pytest.mark.parametrize("nodes, tokens, parents, depths", [
    (4, [0, 2, 3, 4, 5], [-1, 0, 0, 1, 1], [0, 1, 1, 2, 2]),  # .6, .30, .25, .24
    (6, [0, 2, 3, 4, 5, 4, 1], [-1, 0, 0, 1, 1, 2, 3], [0, 1, 1, 2, 2, 2, 3]),  # then .225 and .21
])
def test_build_tree_hand_made(nodes, tokens, parents, depths):
  got = tr.build_tree(jnp.asarray([0]), [jnp.asarray(LOGPROBS[0][:, 0])] + [jnp.asarray(x) for x in LOGPROBS[1:]],
                      settings.Tree(top_k=2, nodes=nodes))
  np.testing.assert_array_equal(got[0], [tokens])
  np.testing.assert_array_equal(got[1], [parents])
  np.testing.assert_array_equal(got[2], [depths])
  want = np.eye(nodes + 1, dtype=bool)
  for n in range(nodes + 1):
    m = parents[n]
    while m >= 0:
      want[n, m] = True
      m = parents[m]
  np.testing.assert_array_equal(got[3], [want])


def test_top_k_1_is_a_chain():
  rng = np.random.RandomState(0)
  logprobs = [jax.nn.log_softmax(jnp.asarray(rng.randn(3, V)))] + [
      jax.nn.log_softmax(jnp.asarray(rng.randn(3, 1, V))) for _ in range(3)]
  tokens, parents, depths, ancestors = tr.build_tree(jnp.zeros((3,), jnp.int32), logprobs, settings.Tree(top_k=1, nodes=4))
  np.testing.assert_array_equal(parents, np.tile([-1, 0, 1, 2, 3], (3, 1)))
  np.testing.assert_array_equal(depths, np.tile(np.arange(5), (3, 1)))
  np.testing.assert_array_equal(ancestors, np.tile(np.tril(np.ones((5, 5), bool)), (3, 1, 1)))
  np.testing.assert_array_equal(tokens[:, 1], np.argmax(logprobs[0], axis=-1))
