"""The functional T5 against transformers' T5ForConditionalGeneration, and its cache against a full pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec.models import t5

from conftest import FAMILIES, load_hf_reference


def _batch(vocab, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(2, vocab, size=(3, 40))
  ids[1, 25:] = 0  # ragged encoder inputs
  ids[2, 7:] = 0
  dec = rng.randint(2, vocab, size=(3, 33))
  dec[:, 0] = 0
  return ids, dec


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers(hf_dirs, family):
  model = jaxspec.load(hf_dirs[family], dtype=jnp.float32)
  ref = load_hf_reference(hf_dirs[family])
  ids, dec = _batch(model.config.vocab_size)
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids != 0),
               decoder_input_ids=torch.tensor(dec)).logits.numpy()
  got = np.asarray(t5.forward(model.params, model.config, jnp.asarray(ids), jnp.asarray(dec)))
  # Sequence lengths above 16 cross the relative-position bucket boundaries (16, 32 with max_distance 20).
  assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_family_conventions_are_read(hf_dirs):
  v10 = jaxspec.load(hf_dirs["t5_v1_0"]).config
  v11 = jaxspec.load(hf_dirs["t5_v1_1"]).config
  odd = jaxspec.load(hf_dirs["odd"]).config
  assert (v10.activation, v10.gated, v10.tie_word_embeddings, v10.scale_decoder_outputs) == ("relu", False, True, True)
  assert (v11.activation, v11.gated, v11.tie_word_embeddings, v11.scale_decoder_outputs) == (
      "gelu_new", True, False, False)
  assert (odd.num_heads * odd.d_kv, odd.d_model, odd.num_layers, odd.num_decoder_layers) == (18, 16, 3, 2)


@pytest.mark.parametrize("family", ["t5_v1_1", "odd"])
def test_incremental_decoding_matches_full_pass(hf_dirs, family):
  model = jaxspec.load(hf_dirs[family], dtype=jnp.float32)
  cfg, params = model.config, model.params
  ids, dec = _batch(cfg.vocab_size, seed=1)
  full = np.asarray(t5.forward(params, cfg, jnp.asarray(ids), jnp.asarray(dec)))
  length = dec.shape[1]
  step = jax.jit(lambda c, tok: t5.decode(params, cfg, c, tok))

  # One token at a time.
  cache = t5.init_cache(params, cfg, jnp.asarray(ids), length + 8)
  got = []
  for t in range(length):
    logits, cache = step(cache, jnp.asarray(dec[:, t:t + 1]))
    got.append(np.asarray(logits[:, 0]))
  np.testing.assert_allclose(np.stack(got, 1), full, atol=1e-4 * np.abs(full).max(), rtol=0)

  # Blocks of 4 at ragged per-row offsets, with a rollback: each row first feeds a block of garbage, is rolled
  # back, then feeds the true tokens. The garbage must leave no trace.
  cache = t5.init_cache(params, cfg, jnp.asarray(ids), length + 8)
  starts = np.array([0, 0, 0])
  rows_out = [[] for _ in range(3)]
  rng = np.random.RandomState(2)
  plan = [np.array([3, 1, 4]), np.array([4, 4, 2]), np.array([2, 3, 4])]  # true tokens fed per row per round
  T = 4
  for k in plan:
    before = cache.lengths
    junk = rng.randint(2, cfg.vocab_size, size=(3, T))
    _, cache = step(cache, jnp.asarray(junk))
    cache = cache.replace(lengths=before)  # rollback
    # Positions past k[b] get junk too: they are written, then masked and overwritten by the next round.
    block = rng.randint(2, cfg.vocab_size, size=(3, T))
    for b in range(3):
      block[b, :k[b]] = dec[b, starts[b]:starts[b] + k[b]]
    logits, cache = step(cache, jnp.asarray(block))
    for b in range(3):
      rows_out[b].append(np.asarray(logits[b, :k[b]]))
    starts = starts + k
    cache = cache.replace(lengths=jnp.asarray(starts, jnp.int32))  # keep k[b] of the T positions
  for b in range(3):
    got = np.concatenate(rows_out[b])
    np.testing.assert_allclose(got, full[b, :len(got)], atol=1e-4 * np.abs(full).max(), rtol=0)


def test_axis_names_cover_every_array(hf_dirs):
  model = jaxspec.load(hf_dirs["t5_v1_1"])
  axes = t5.param_axes(model.config)
  is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, str) for a in x)
  assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(model.params)
  for ax, arr in zip(jax.tree.leaves(axes, is_leaf=is_axes), jax.tree.leaves(model.params)):
    assert len(ax) == arr.ndim
  cache = t5.init_cache(model.params, model.config, jnp.ones((2, 5), jnp.int32), 7)
  cache_axes = jax.tree.leaves(t5.cache_axes(model.config), is_leaf=is_axes)
  assert len(cache_axes) == len(jax.tree.leaves(cache))
  for ax, arr in zip(cache_axes, jax.tree.leaves(cache)):
    assert len(ax) == arr.ndim
