"""Exact acceptance over token trees (jaxspec/decoding/device/tree_verify.py).

A position-dependent Markov chain is the target (tests/stub_models.py: logits of the token at position t are
table[token] + position_bias[t]), so a node's distribution is known from its token and position alone. Trees of
random candidates (chosen without looking at the target) are verified round after round, 4000 rows at once,
and the emitted tokens are compared with plain greedy decoding, or, sampling, the joint distribution of the
first tokens with exact enumeration (chi-square), with a negative control that must fail.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from stub_models import chi_square, chi_square_limit, exact_sequence_probs  # noqa: E402

from jaxspec.decoding.device import tree_verify  # noqa: E402

VOCAB, POSITIONS, LENGTH, ROWS = 4, 64, 3, 4000
# A tree of 8 nodes: two candidates under the root, two under node 1, one under nodes 2, 3 and 5 (depth 3).
# Siblings are tried in node order.
PARENTS = np.array([-1, 0, 0, 1, 1, 2, 3, 5], np.int32)


@pytest.fixture(autouse=True)
def strict_ranks():
  with jax.numpy_rank_promotion("raise"):
    yield


def markov(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(table [V, V], position_bias [P, V]): a target whose distribution changes with the position."""
  rng = np.random.RandomState(seed)
  return rng.randn(VOCAB, VOCAB).astype(np.float32) * 0.7, rng.randn(POSITIONS, VOCAB).astype(np.float32) * 0.5


def depths_of(parents: np.ndarray) -> np.ndarray:
  depths = np.zeros(len(parents), np.int32)
  for n in range(1, len(parents)):
    depths[n] = depths[parents[n]] + 1
  return depths


def draft_trees(roots: np.ndarray, draft: np.ndarray, parents: np.ndarray = PARENTS) -> np.ndarray:
  """[R, N] node tokens: the root is each row's current token; a node's children are the top-k of a Markov draft
  (draft [V, V] logits) after the node's token, best first, as EAGLE proposes: draft information only, never the
  target's verdict. The draft approximates the target (its table plus noise), as real drafts do: with siblings
  unrelated to the target, the negative controls' biases average out over the trees."""
  rows, n = len(roots), len(parents)
  tokens = np.zeros((rows, n), np.int32)
  tokens[:, 0] = roots
  for node in range(n):
    children = np.flatnonzero(parents == node)
    if len(children):
      tokens[:, children] = np.argsort(-draft[tokens[:, node]], axis=1, kind="stable")[:, :len(children)]
  return tokens


def node_logits(table: np.ndarray, bias: np.ndarray, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
  """[R, N, V]: the target's logits at every node (node n at its row's position + depth)."""
  return table[tokens] + bias[positions[:, None] + depths_of(PARENTS)[None]]


def run_rounds(verify, table, bias, draft, rows: int, length: int, parents: np.ndarray = PARENTS,
               argmax_first: bool = False):
  """Emitted tokens [rows, length] of tree verification repeated round after round, from start token 0 at
  position 0; `verify(round, tokens, logits) -> TreeAcceptance`. argmax_first: every other round, the target's
  argmax is the root's first candidate (long greedy paths happen too)."""
  out = [[] for _ in range(rows)]
  current, position = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
  rnd = 0
  while min(len(o) for o in out) < length:  # every round emits 1 to depth + 1 tokens per row
    tokens = draft_trees(current, draft, parents)
    if argmax_first and rnd % 2 == 0:
      best = np.argmax(table[current] + bias[position], axis=1)
      siblings = np.flatnonzero(parents == 0)
      clash = tokens[:, siblings] == best[:, None]
      tokens[:, siblings] = np.where(clash, tokens[:, siblings[:1]], tokens[:, siblings])
      tokens[:, siblings[0]] = best
    verdict = verify(rnd, jnp.asarray(tokens), jnp.asarray(node_logits(table, bias, tokens, position)))
    path, path_len, nxt = (np.asarray(a) for a in (verdict.path, verdict.path_len, verdict.next_token))
    for r in range(rows):
      emitted = list(tokens[r, path[r, 1:path_len[r]]]) + [int(nxt[r])]
      out[r].extend(emitted)
      position[r] += len(emitted)
      current[r] = emitted[-1]
    rnd += 1
  return np.array([o[:length] for o in out], np.int32)


def test_greedy_hand_made():
  """The argmax chain 0 -> 2 -> 5 -> 7, then node 7's argmax; another row stops at the root."""
  tokens = jnp.asarray([[9, 1, 2, 3, 4, 5, 6, 7], [9, 1, 2, 3, 4, 5, 6, 7]], jnp.int32)
  logits = np.zeros((2, 8, 10), np.float32)
  logits[0, 0, 2] = logits[0, 2, 5] = logits[0, 5, 7] = logits[0, 7, 8] = 1.0
  logits[1, 0, 0] = 1.0  # token 0: no child of the root carries it
  parents = jnp.asarray(np.stack([PARENTS, PARENTS]))
  verdict = tree_verify.accept_tree_greedy(tokens, parents, jnp.asarray(logits), path_size=4)
  np.testing.assert_array_equal(verdict.path, [[0, 2, 5, 7], [0, 0, 0, 0]])
  np.testing.assert_array_equal(verdict.path_len, [4, 1])
  np.testing.assert_array_equal(verdict.num_accepted, [3, 0])
  np.testing.assert_array_equal(verdict.next_token, [8, 0])


def test_greedy_is_plain_greedy_decoding():
  """Rounds of tree verification emit the target's greedy chain."""
  table, bias = markov(1)
  rows, length = 64, 12
  verify = jax.jit(lambda rnd, tokens, logits: tree_verify.accept_tree_greedy(
      tokens, jnp.broadcast_to(jnp.asarray(PARENTS), tokens.shape), logits, path_size=4))
  draft = np.random.RandomState(0).randn(VOCAB, VOCAB)  # unrelated to the target
  got = run_rounds(verify, table, bias, draft, rows, length, argmax_first=True)
  token, want = 0, []
  for t in range(length):
    token = int(np.argmax(table[token] + bias[t]))
    want.append(token)
  np.testing.assert_array_equal(got, np.tile(want, (rows, 1)))


def test_sampled_hand_made():
  """Row 0: one-hot targets, the path follows them to the deepest node. Row 1: no child carries the target's
  only token: the correction is that token. Rows 2+: the root's children carry tokens 1 (p 0.5) and 2 (p 0):
  either node 1 is accepted, or both are rejected and the correction comes from what remains, token 3."""
  rows = 66
  tokens = jnp.asarray([[0, 1, 2, 3, 0, 2, 1, 3]] * rows, jnp.int32)
  p = np.full((rows, 8, VOCAB), 1.0 / VOCAB, np.float32)
  p[0] = 0.0
  p[0, 0, 2] = p[0, 2, 2] = p[0, 5, 3] = p[0, 7, 1] = 1.0  # nodes 2 (token 2), 5 (token 2), 7 (token 3); then 1
  p[1, 0] = [1.0, 0.0, 0.0, 0.0]
  p[2:, 0] = [0.0, 0.5, 0.0, 0.5]
  parents = jnp.asarray(np.stack([PARENTS] * rows))
  keys = jax.random.split(jax.random.key(0), rows)
  verdict = tree_verify.accept_tree_sampled(keys, tokens, parents, jnp.asarray(p), path_size=4)
  path, path_len, nxt = (np.asarray(a) for a in (verdict.path, verdict.path_len, verdict.next_token))
  np.testing.assert_array_equal(path[:2], [[0, 2, 5, 7], [0, 0, 0, 0]])
  np.testing.assert_array_equal(nxt[:2], [1, 0])
  accepted = path[2:, 1] == 1
  assert np.all(accepted | ((path_len[2:] == 1) & (nxt[2:] == 3)))
  assert 10 < accepted.sum() < 54  # both happen (binomial(64, 0.5))


def _sampled_verify(temperature: float):
  def verify(rnd, tokens, logits):
    keys = jax.random.split(jax.random.fold_in(jax.random.key(7), rnd), tokens.shape[0])
    p = jax.nn.softmax(logits / temperature, axis=-1)
    return tree_verify.accept_tree_sampled(keys, tokens, jnp.broadcast_to(jnp.asarray(PARENTS), tokens.shape), p,
                                           path_size=4)
  return jax.jit(verify)


def _joint_chi_square(temperature: float) -> tuple[float, float]:
  table, bias = markov(2)
  draft = table + 0.3 * np.random.RandomState(3).randn(VOCAB, VOCAB)
  samples = run_rounds(_sampled_verify(temperature), table, bias, draft, ROWS, LENGTH)

  def next_probs(prefix):
    logits = (table[prefix[-1]] + bias[len(prefix) - 1]) / temperature
    e = np.exp(logits - logits.max())
    return e / e.sum()

  exact = exact_sequence_probs(next_probs, VOCAB, LENGTH, eos=-1, start=0)
  stat, dof = chi_square([tuple(int(t) for t in s) for s in samples], exact)
  return stat, chi_square_limit(dof)


@pytest.mark.slow
def test_sampled_joint_distribution_is_the_targets():
  """Chi-square of the joint distribution of the first 3 emitted tokens (64 outcomes, 4000 rows) against exact
  enumeration of the target's sequences."""
  stat, limit = _joint_chi_square(temperature=0.8)
  assert stat < limit, (stat, limit)


@pytest.mark.slow
def test_negative_control_fallback_from_p_fails(monkeypatch):
  """Sampling the correction from p (rejected siblings left in) instead of the residual is detected."""
  monkeypatch.setattr(tree_verify, "_residual", lambda p_node, tokens, rejected: p_node)
  stat, limit = _joint_chi_square(temperature=0.8)
  assert stat > limit, (stat, limit)


@pytest.mark.slow
def test_negative_control_no_renormalisation_fails(monkeypatch):
  """Trying each sibling against p (accept with p(x)) instead of the residual left by the rejected ones before
  it (p(x) / (1 - their mass)) is detected."""
  monkeypatch.setattr(tree_verify, "_mass_when_tried", lambda p_node, p_x: jnp.sum(p_node, axis=1, keepdims=True))
  stat, limit = _joint_chi_square(temperature=0.8)
  assert stat > limit, (stat, limit)
