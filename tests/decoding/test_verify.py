"""Unit tests of jaxspec.decoding.device.verify: greedy acceptance, the rejection rule and the residual, on hand-made
p and q whose answers are known (the loop-level exactness tests are in test_generate.py and test_sampling_lossless.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.decoding.device import verify


@pytest.fixture(autouse=True)
def strict_ranks():
  with jax.numpy_rank_promotion("raise"):
    yield


def _logits(argmaxes, vocab: int = 6) -> jax.Array:
  """[B, T, V] logits whose argmax at (b, t) is argmaxes[b][t]."""
  a = np.asarray(argmaxes)
  return jnp.asarray(np.where(np.arange(vocab) == a[..., None], 5.0, 0.0), jnp.float32)


def test_greedy_keeps_the_prefix_equal_to_the_argmax_and_emits_the_next_argmax():
  drafts = jnp.asarray([[1, 2, 3], [1, 2, 3], [4, 4, 4]], jnp.int32)
  target = _logits([[1, 2, 5, 0], [1, 2, 3, 2], [3, 4, 4, 1]])  # row 0 two kept, row 1 all, row 2 none
  v = verify.accept_greedy(drafts, target)
  assert v.num_accepted.tolist() == [2, 3, 0]
  assert v.next_token.tolist() == [5, 2, 3]  # the correction at the first miss, or the bonus after all
  np.testing.assert_array_equal(v.beta, [[1, 1, 0], [1, 1, 1], [0, 1, 1]])  # argmax agreement per position


def test_greedy_never_accepts_positions_that_were_not_drafted():
  drafts = jnp.asarray([[1, 2, 3], [1, 2, 3]], jnp.int32)
  target = _logits([[1, 2, 3, 0], [1, 2, 3, 0]])
  v = verify.accept_greedy(drafts, target, num_drafted=jnp.asarray([1, 0], jnp.int32))
  assert v.num_accepted.tolist() == [1, 0]
  assert v.next_token.tolist() == [2, 1]  # from p at position k: nothing was drafted there
  np.testing.assert_array_equal(v.beta, [[1, 0, 0], [0, 0, 0]])


def test_residual_is_the_normalised_excess_and_falls_back_to_p():
  p = jnp.asarray([[0.5, 0.3, 0.2, 0.0]])
  q = jnp.asarray([[0.2, 0.6, 0.2, 0.0]])
  np.testing.assert_allclose(verify.residual_probs(p, q), [[1.0, 0.0, 0.0, 0.0]], atol=1e-6)
  np.testing.assert_allclose(verify.residual_probs(p, p), p)  # no mass left: p itself, never noise renormalised


def test_certain_acceptance_and_certain_rejection():
  keys = jax.random.split(jax.random.key(0), 2)
  onehot = lambda i: jnp.eye(4, dtype=jnp.float32)[i]
  q = jnp.stack([onehot(1), onehot(1)])[:, None]  # [2, 1, 4]: both rows drafted token 1 with certainty
  p = jnp.stack([jnp.stack([onehot(1), onehot(2)]), jnp.stack([onehot(3), onehot(2)])])  # [2, 2, 4]
  v = verify.accept_sampled(keys, jnp.asarray([[1], [1]], jnp.int32), q, p)
  assert v.num_accepted.tolist() == [1, 0]  # p(1) = q(1) accepts; p(1) = 0 rejects
  assert v.next_token.tolist() == [2, 3]  # the bonus from p's next row; the correction from the residual


@pytest.mark.parametrize("deterministic", [False, True])
def test_acceptance_probability_is_min_one_p_over_q(deterministic):
  """Over many keys, a draft token x is kept with probability min(1, p(x)/q(x)) (q one-hot: p(x)), and the next
  token after a rejection follows the residual."""
  rows = 20000
  p_row = jnp.asarray([0.1, 0.6, 0.3], jnp.float32)
  q_row = jnp.asarray([0.5, 0.2, 0.3], jnp.float32)
  keys = jax.random.split(jax.random.key(1), rows)
  drafts = jnp.zeros((rows, 1), jnp.int32)  # token 0: p/q = 0.2
  p = jnp.broadcast_to(p_row, (rows, 2, 3))
  q = None if deterministic else jnp.broadcast_to(q_row, (rows, 1, 3))
  v = jax.jit(verify.accept_sampled)(keys, drafts, q, p)
  accepted = float(np.mean(np.asarray(v.num_accepted)))
  want = 0.1 if deterministic else 0.2
  assert abs(accepted - want) < 4 * np.sqrt(want * (1 - want) / rows)
  rejected = np.asarray(v.next_token)[np.asarray(v.num_accepted) == 0]
  residual = np.asarray(verify.residual_probs(p_row[None], (jnp.eye(3)[0] if deterministic else q_row)[None]))[0]
  freq = np.bincount(rejected, minlength=3) / len(rejected)
  np.testing.assert_allclose(freq, residual, atol=0.02)
  assert freq[0] == 0  # the rejected token never comes back from the residual
