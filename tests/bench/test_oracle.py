"""The oracle draft (jaxspec/bench/oracle.py): exact greedy output, the acceptance process it promises, its cost."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.bench import oracle
from jaxspec.models import t5

GAMMA = 3
N = 37  # Tokens per row: not a multiple of gamma + 1.


def _model(seed, **shape):
  cfg = t5.T5Config(vocab_size=64, d_kv=8, num_heads=2, relative_attention_num_buckets=8,
                    relative_attention_max_distance=20, **shape)
  return t5.T5Decoder(cfg), t5.init_params(cfg, jax.random.key(seed))


@pytest.fixture(scope="module")
def pair():
  target = _model(0, d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2)
  draft = _model(1, d_model=16, d_ff=32, num_layers=1, num_decoder_layers=1)
  ids = jnp.asarray(np.random.RandomState(0).randint(2, 64, size=(5, 9)), jnp.int32)
  lengths = jnp.full((5,), 9, jnp.int32)
  greedy = oracle.greedy_tokens(target[0], target[1], ids, lengths, N + GAMMA + 1)
  return target, draft, ids, lengths, greedy


def _simulate(seed: int, alpha: float) -> tuple[int, int]:
  """(iterations, accepted drafts) of one row under the i.i.d. process the oracle promises."""
  pos = iterations = accepted = 0
  while pos < N:
    ok = oracle.accept_mask_np(np.uint32(seed), np.arange(pos, pos + GAMMA), alpha)
    k = int(np.argmin(ok)) if not ok.all() else GAMMA
    accepted += k
    pos += min(k + 1, N - pos)
    iterations += 1
  return iterations, accepted


@pytest.mark.parametrize("alpha", [0.0, 0.6, 0.9, 1.0])
def test_output_is_greedy_and_acceptance_follows_the_hash(pair, alpha):
  (t_dec, t_params), (d_dec, d_params), ids, lengths, greedy = pair
  seeds = np.arange(11, 16, dtype=np.uint32)
  settings = oracle.oracle_settings(t_dec, oracle.OracleDecoder(d_dec), GAMMA, N)
  state = oracle.decode(settings, t_params, oracle.oracle_params(d_params, greedy, seeds, alpha), ids, lengths)
  np.testing.assert_array_equal(np.asarray(state.sequences[:, 1:1 + N]), np.asarray(greedy[:, :N]))
  np.testing.assert_array_equal(np.asarray(state.lengths), N + 1)
  expected = np.array([_simulate(int(s), alpha) for s in seeds])
  np.testing.assert_array_equal(np.asarray(state.stats.iterations), expected[:, 0])
  np.testing.assert_array_equal(np.asarray(state.stats.accepted), expected[:, 1])


def test_hash_rate_and_agreement():
  seeds = np.arange(64, dtype=np.uint32)[:, None]
  positions = np.broadcast_to(np.arange(256, dtype=np.int32), (64, 256))
  for alpha in (0.25, 0.75, 0.82):
    np_mask = oracle.accept_mask_np(seeds, positions, alpha)
    assert abs(np_mask.mean() - alpha) < 0.02
    jnp_mask = oracle.accept_mask(jnp.asarray(seeds), jnp.asarray(positions), jnp.float32(alpha))
    np.testing.assert_array_equal(np.asarray(jnp_mask), np_mask)
  # Neighbouring positions and seeds are not correlated: the rate of two consecutive accepts is alpha ** 2.
  mask = oracle.accept_mask_np(seeds, positions, 0.5)
  assert abs((mask[:, 1:] & mask[:, :-1]).mean() - 0.25) < 0.02
  assert abs((mask[1:] & mask[:-1]).mean() - 0.25) < 0.02


def test_the_real_step_is_computed(pair):
  """XLA must not drop the wrapped model's work: the oracle's step costs at least the inner step's flops."""
  _, (d_dec, d_params), ids, lengths, greedy = pair
  cache = d_dec.prefill(d_params, ids, lengths, N + GAMMA + 1).cache
  tokens = jnp.zeros((5, 1), jnp.int32)
  params = oracle.oracle_params(d_params, greedy, np.arange(5, dtype=np.uint32), 0.5)

  def flops(fn, p):
    return jax.jit(lambda p, c: fn(p, c, tokens).logits).lower(p, cache).compile().cost_analysis()["flops"]
  inner = flops(d_dec.step, d_params)
  assert inner > 0
  assert flops(oracle.OracleDecoder(d_dec).step, params) >= inner


def test_alpha_out_of_range():
  with pytest.raises(ValueError, match="alpha"):
    oracle.oracle_params({}, jnp.zeros((1, 4), jnp.int32), np.zeros(1, np.uint32), 1.5)
