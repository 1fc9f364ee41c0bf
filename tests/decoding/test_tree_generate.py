"""Token trees in the loop (`jaxspec.Speculation(draft, gamma, tree=jaxspec.Tree(top_k, nodes))`): greedy output
identical to plain decoding (T5 here; every decoder-only family in test_decoder_only_generate.py), a tree of one
child per node equal to the chain loop, the target's cache after tree iterations equal to a fresh prefill of the
output, and bad tree settings as one clear error. Lossless sampling: test_sampling_lossless.py."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.device import loop, sampling
from jaxspec.decoding.drafters.model_drafter import ModelDrafter

from conftest import write_hf_t5
from decoder_only_models import checkpoint_dirs, ragged_prompts

MAX_NEW = 13  # not a multiple of any depth + 1 tested: max_new_tokens ends rows inside a branch


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """A tiny T5 1.1 target and a noisy copy of it as the draft (acceptance high enough for long branches)."""
  target_dir = write_hf_t5(str(tmp_path_factory.mktemp("tree") / "target"), "t5_v1_1", d_model=32, num_layers=3,
                           num_decoder_layers=2, num_heads=4, d_ff=64)
  target = jaxspec.load(target_dir, dtype=jnp.float32)
  return target, _noisy(target)


def _noisy(model: jaxspec.Model) -> jaxspec.Model:
  """A draft that agrees with `model` most of the time: its parameters plus noise."""
  leaves, treedef = jax.tree.flatten(model.params)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  noisy = [x + 0.2 * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return jaxspec.Model(model.config, jax.tree.unflatten(treedef, noisy), model.tokenizer, name="noisy")


def _prompts(vocab, seed=0):
  rng = np.random.RandomState(seed)
  return [list(rng.randint(2, vocab, size=n)) + [1] for n in (4, 11, 1, 7)]


def _with_eos(model, eos):
  return dataclasses.replace(model, config=dataclasses.replace(model.config, eos_token_id=eos))


@pytest.mark.parametrize("gamma,top_k,nodes", [(3, 3, 8)])
def test_greedy_trees_equal_plain_decoding(pair, gamma, top_k, nodes):
  """Ragged rows: an EOS that ends rows at different steps (inside accepted branches), max_new_tokens inside a
  branch; the tree accepts more per target call than the chain of the same depth."""
  target, draft = pair
  prompts = _prompts(target.config.vocab_size)
  plain = jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW)
  eos = int(plain.tokens[0, 5])  # a token the first row emits mid-sequence
  target, draft = _with_eos(target, eos), _with_eos(draft, eos)
  plain = jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW)
  assert len(set(plain.lengths.tolist())) > 1 and plain.lengths.max() == MAX_NEW  # ragged, some rows at the cap
  tree = jaxspec.Tree(top_k=top_k, nodes=nodes)
  spec = jaxspec.generate(target, prompts, jaxspec.Speculation(draft, gamma=gamma, tree=tree),
                          max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  chain = jaxspec.generate(target, prompts, jaxspec.Speculation(draft, gamma=gamma), max_new_tokens=MAX_NEW)
  assert spec.stats.tokens_per_iteration > chain.stats.tokens_per_iteration
  assert spec.stats.acceptance_per_position.shape == (gamma,)  # acceptance per depth
  lookup = jaxspec.generate(target, prompts, jaxspec.Speculation(jaxspec.NGramDraft(2), gamma=gamma, tree=tree),
                            max_new_tokens=MAX_NEW)  # prompt-lookup trees
  np.testing.assert_array_equal(lookup.tokens, plain.tokens)
  np.testing.assert_array_equal(lookup.lengths, plain.lengths)


def _settings(target, draft, gamma, tree):
  """The loop's static settings, built here (the engine maps a one-child tree to the chain loop): greedy."""
  cfg = target.config
  return loop.LoopSettings(target=target.decoder(), drafter=ModelDrafter(draft.decoder()), gamma=gamma,
                           max_new_tokens=MAX_NEW, greedy=True, filtering=False, eos_ids=tuple(cfg.eos_token_ids),
                           pad_id=cfg.pad_token_id, tree=tree)


def _loop_state(settings, target, draft, prompts):
  """The loop's final state for right-padded prompts, run directly with these static settings."""
  width = max(map(len, prompts))
  ids = jnp.asarray([p + [target.config.pad_token_id] * (width - len(p)) for p in prompts], jnp.int32)
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
  tc, dc, first = jax.jit(functools.partial(loop.prefill, settings))(target.params, draft.params, ids, lengths)
  return jax.jit(functools.partial(loop.run, settings))(
      target.params, draft.params, tc, dc, first, sampling.SamplingKnobs.create(0.0, 0, 1.0),
      np.zeros((len(prompts),), np.uint32), np.arange(len(prompts), dtype=np.int32))


def _loop_outputs(settings, target, draft, prompts):
  state = _loop_state(settings, target, draft, prompts)
  return jax.device_get((state.sequences, state.lengths, state.stats.accepted))


def test_a_one_child_tree_is_the_chain(pair):
  """The tree machinery (draft beams, step_tree, tree verification, compaction) with top_k = 1 emits the chain
  loop's tokens and accepts as many drafts."""
  target, draft = pair
  prompts = _prompts(target.config.vocab_size, seed=1)
  chain = _loop_outputs(_settings(target, draft, 3, None), target, draft, prompts)
  tree = _loop_outputs(_settings(target, draft, 3, jaxspec.Tree(top_k=1, nodes=3)), target, draft, prompts)
  for c, t in zip(chain, tree):
    np.testing.assert_array_equal(t, c)
  assert chain[2].sum() > 0


def test_the_cache_after_tree_iterations_is_a_fresh_prefill(tmp_path_factory):
  """A Llama target after a whole tree decode: its cache holds, at every position it has fed, what a fresh
  prefill of prompt + output computes (the accepted paths were compacted into consecutive positions)."""
  target = jaxspec.load(checkpoint_dirs(tmp_path_factory)["llama2"], dtype=jnp.float32)
  draft = _noisy(target)
  prompts = ragged_prompts((3, 9), seed=2)
  state = _loop_state(_settings(target, draft, 3, jaxspec.Tree(top_k=2, nodes=5)), target, draft, prompts)
  cache = state.target_cache
  for row, prompt in enumerate(prompts):
    n = int(state.lengths[row])
    full = prompt + np.asarray(state.sequences[row, 1:n]).tolist()  # prompt, then every output token
    fresh = target.decoder().prefill(target.params, jnp.asarray([full]), jnp.asarray([len(full)]), 4).cache
    fed = len(full) - 1  # the newest token is fed by the next iteration
    assert int(cache.lengths[row]) == fed
    for got, want in zip(cache.k + cache.v, fresh.k + fresh.v):
      np.testing.assert_allclose(got[row, :fed], want[0, :fed], rtol=1e-5, atol=1e-5)
  assert int(state.stats.accepted.sum()) > 0  # paths of several nodes were compacted


def test_bad_tree_settings_are_one_clear_error(pair):
  target, draft = pair
  cases = [
      (dict(tree=(8, 60)), "jaxspec.Tree"),
      (dict(tree=jaxspec.Tree(4, 30), gamma=2), "depth"),
      (dict(tree=jaxspec.Tree(2, 4), schedule="adaptive"), "schedule='constant'"),
  ]
  for kwargs, words in cases:
    with pytest.raises(jaxspec.SettingsError, match=words):
      jaxspec.Speculation(draft, **{"gamma": 3, **kwargs})
  head = jaxspec.FeatureHead.__new__(jaxspec.FeatureHead)  # any FeatureHead: its fields are not read here
  assert jaxspec.Speculation(head, gamma=3, tree=jaxspec.Tree(2, 4)).tree == jaxspec.Tree(2, 4)  # heads grow trees
  with pytest.raises(jaxspec.SettingsError, match="schedule='constant'"):  # with the same checks
    jaxspec.Speculation(head, gamma=3, tree=jaxspec.Tree(2, 4), schedule="heuristic")
  for bad in (dict(top_k=0), dict(nodes=0), dict(top_k=2.5), dict(nodes=True)):
    with pytest.raises(jaxspec.SettingsError, match="Tree"):
      jaxspec.Tree(**bad)
