"""`oracle.OracleDrafter`: any drafter's real step with designed acceptance (issue 32 item 3).

Chains (a T5 draft model, prompt lookup, an EAGLE-3 head on a decoder-only target) and trees (the draft model,
the head): greedy output equals plain decoding, and the loop accepts exactly what the design says: per row, the
iterations and accepted drafts of the i.i.d. process (chains: alpha per position; trees: floor(accepted) or one
more per iteration), and the measured alpha (accepted per iteration) within binomial error of the design.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.bench import oracle
from jaxspec.decoding.drafters.model_drafter import ModelDrafter
from jaxspec.decoding.drafters.ngram import NGramDrafter
from jaxspec.decoding.drafters.head_drafter import HeadDrafter
from jaxspec.decoding.settings import Tree
from jaxspec.errors import SettingsError
from jaxspec.models import decoder_only as do
from jaxspec.models import eagle3, t5
from jaxspec.models.decoder_only.llama import LlamaConfig

GAMMA, N, V = 3, 29, 64  # N tokens per row: not a multiple of gamma + 1
TREE = Tree(top_k=2, nodes=5)


def _t5(seed, **shape):
  cfg = t5.T5Config(vocab_size=V, d_kv=8, num_heads=2, relative_attention_num_buckets=8,
                    relative_attention_max_distance=20, **shape)
  return t5.T5Decoder(cfg), t5.init_params(cfg, jax.random.key(seed))


@pytest.fixture(scope="module")
def t5_pair():
  target = _t5(0, d_model=32, d_ff=64, num_layers=1, num_decoder_layers=2)
  draft = _t5(1, d_model=16, d_ff=32, num_layers=1, num_decoder_layers=1)
  ids = jnp.asarray(np.random.RandomState(0).randint(2, V, size=(4, 7)), jnp.int32)
  lengths = jnp.asarray([7, 5, 6, 7], jnp.int32)
  greedy = oracle.greedy_tokens(target[0], target[1], ids, lengths, N + GAMMA + 1)
  return target, draft, ids, lengths, greedy


@pytest.fixture(scope="module")
def head_pair():
  """A tiny Llama target and a random EAGLE-3 head over its layers 0-2."""
  cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                    head_dim=8, eos_ids=(1,), pad_token_id=0, bos_token_id=None)
  params = do.init_params(cfg, jax.random.PRNGKey(0))
  import jaxspec
  model = jaxspec.Model(cfg, params, name="tiny-llama")
  hcfg = eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=V, hidden_size=32, target_hidden_size=32,
                             intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 1, 2))
  head = jaxspec.FeatureHead(hcfg, eagle3.init_params(hcfg, jax.random.PRNGKey(1)), name="tiny-head")
  from jaxspec.decoding.drafters import registry
  drafter, head_params = registry.head_drafter(model, head)
  ids = jnp.asarray(np.random.RandomState(1).randint(2, V, size=(4, 6)), jnp.int32)
  lengths = jnp.asarray([6, 4, 5, 6], jnp.int32)
  greedy = oracle.greedy_tokens(model.decoder(), params, ids, lengths, N + GAMMA + 1)
  return (model.decoder(), params), drafter, head_params, ids, lengths, greedy


def _simulate_chain(seed, alpha):
  pos = iterations = accepted = 0
  while pos < N:
    ok = oracle.accept_mask_np(np.uint32(seed), np.arange(pos, pos + GAMMA), alpha)
    k = int(np.argmin(ok)) if not ok.all() else GAMMA
    accepted, pos, iterations = accepted + k, pos + min(k + 1, N - pos), iterations + 1
  return iterations, accepted


def _simulate_tree(seed, mean, depth):
  pos = iterations = accepted = 0
  while pos < N:
    k = int(oracle.tree_accepted(np.uint32(seed), np.int32(pos), mean, depth))
    accepted, pos, iterations = accepted + k, pos + min(k + 1, N - pos), iterations + 1
  return iterations, accepted


def _run(target, drafter, inner_params, ids, lengths, greedy, seeds, tree=None, **design):
  settings = oracle.drafter_settings(target[0], oracle.OracleDrafter(drafter, V), GAMMA, N, tree)
  params = oracle.drafter_params(inner_params, greedy, seeds, **design)
  state = oracle.decode(settings, target[1], params, ids, lengths)
  np.testing.assert_array_equal(np.asarray(state.sequences[:, 1:1 + N]), np.asarray(greedy[:, :N]))
  return state


def _check(state, expected):
  np.testing.assert_array_equal(np.asarray(state.stats.iterations), expected[:, 0])
  np.testing.assert_array_equal(np.asarray(state.stats.accepted), expected[:, 1])


SEEDS = np.arange(21, 25, dtype=np.uint32)


@pytest.mark.parametrize("alpha", [0.0, 0.7, 1.0])
def test_model_draft_chain(t5_pair, alpha):
  target, (d_dec, d_params), ids, lengths, greedy = t5_pair
  state = _run(target, ModelDrafter(d_dec), d_params, ids, lengths, greedy, SEEDS, alpha=alpha)
  _check(state, np.array([_simulate_chain(int(s), alpha) for s in SEEDS]))
  got = oracle.measured_acceptance(state.stats, GAMMA)  # ~60 judged positions: within 3 binomial errors
  assert abs(got["alpha"] - alpha) <= 3 * got["alpha_stderr"] + 1e-6, got


def test_prompt_lookup_chain(t5_pair):
  """Prompt lookup finds nothing in most rows here; the oracle still proposes gamma tokens a row."""
  target, _, ids, lengths, greedy = t5_pair
  state = _run(target, NGramDrafter(), None, ids, lengths, greedy, SEEDS, alpha=0.7)
  _check(state, np.array([_simulate_chain(int(s), 0.7) for s in SEEDS]))


@pytest.mark.parametrize("mean", [0.0, 1.6, 3.0])
def test_model_draft_tree(t5_pair, mean):
  target, (d_dec, d_params), ids, lengths, greedy = t5_pair
  state = _run(target, ModelDrafter(d_dec), d_params, ids, lengths, greedy, SEEDS, tree=TREE, accepted=mean)
  _check(state, np.array([_simulate_tree(int(s), mean, GAMMA) for s in SEEDS]))
  # Accepted drafts per iteration: the design's mean within 3 standard errors (its variance is f (1 - f)).
  got, frac = oracle.measured_acceptance(state.stats, GAMMA), mean - np.floor(mean)
  assert abs(got["accepted_per_iteration"] - mean) <= 3 * np.sqrt(frac * (1 - frac) / got["iterations"]) + 1e-6, got


def test_head_chain_and_tree(head_pair):
  target, drafter, head_params, ids, lengths, greedy = head_pair
  assert isinstance(drafter, HeadDrafter) and oracle.OracleDrafter(drafter, V).feature_layers
  state = _run(target, drafter, head_params, ids, lengths, greedy, SEEDS, alpha=0.8)
  _check(state, np.array([_simulate_chain(int(s), 0.8) for s in SEEDS]))
  state = _run(target, drafter, head_params, ids, lengths, greedy, SEEDS, tree=TREE, accepted=2.3)
  _check(state, np.array([_simulate_tree(int(s), 2.3, GAMMA) for s in SEEDS]))


def test_inner_work_is_live(t5_pair):
  """XLA keeps the inner drafter's step: the oracle's propose costs at least the inner's flops."""
  from jaxspec.decoding.device import drafter as drafter_lib
  from jaxspec.decoding.device import sampling
  target, (d_dec, d_params), ids, lengths, greedy = t5_pair
  settings = oracle.drafter_settings(target[0], oracle.OracleDrafter(ModelDrafter(d_dec), V), GAMMA, N)
  static = settings.proposal
  inner = ModelDrafter(d_dec)
  state = inner.init(d_params, ids, lengths, settings.cache_len)
  seq = jnp.zeros((4, settings.seq_len), jnp.int32).at[:, 0].set(greedy[:, 0])
  history = drafter_lib.History(sequences=seq, lengths=jnp.ones((4,), jnp.int32), done=jnp.zeros((4,), bool))
  knobs, keys = sampling.SamplingKnobs.create(0.0, 0, 1.0), jax.random.split(jax.random.key(0), 4)

  def flops(drafter, params):
    fn = lambda p, s: drafter.propose(drafter_lib.DraftRequest(p, s, history, None, static, knobs, jnp.float32(0),
                                                               keys, True)).tokens
    return jax.jit(fn).lower(params, state).compile().cost_analysis()["flops"]
  inner_flops = flops(inner, d_params)
  assert inner_flops > 0
  assert flops(settings.drafter, oracle.drafter_params(d_params, greedy, SEEDS, alpha=0.5)) >= inner_flops


def test_sampling_and_bad_designs_are_refused(t5_pair):
  target, (d_dec, d_params), ids, lengths, greedy = t5_pair
  with pytest.raises(ValueError, match="alpha"):
    oracle.drafter_params(None, greedy, SEEDS, alpha=1.5)
  with pytest.raises(ValueError, match="accepted"):
    oracle.drafter_params(None, greedy, SEEDS, accepted=-1.0)
  import dataclasses
  settings = dataclasses.replace(oracle.drafter_settings(target[0], oracle.OracleDrafter(ModelDrafter(d_dec), V),
                                                         GAMMA, N), greedy=False)
  with pytest.raises(SettingsError, match="temperature 0"):
    oracle.decode(settings, target[1], oracle.drafter_params(d_params, greedy, SEEDS, alpha=0.5), ids, lengths)
