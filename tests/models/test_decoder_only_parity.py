"""Decoder-only families against transformers (torch CPU, eager attention) on tiny random checkpoints, and the KV
cache (prefill, 1-token steps, blocks of gamma + 1 with rollbacks) against one full forward pass."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec.models import decoder_only as do
from jaxspec.models.decoder_only.config import FULL, SLIDING, Rope

from decoder_only_models import VARIANTS, checkpoint_dirs, load_hf_reference, padded, ragged_prompts


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  return checkpoint_dirs(tmp_path_factory)


def _hf_logits(directory, rows):
  ids = padded(rows)
  with torch.no_grad():
    return load_hf_reference(directory)(input_ids=torch.tensor(ids, dtype=torch.long),
                                        attention_mask=torch.tensor(ids != 0, dtype=torch.long)).logits.numpy()


def _max_error(got, want, rows):
  return max(np.abs(got[i, :len(r)] - want[i, :len(r)]).max() for i, r in enumerate(rows))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(dirs, variant):
  """Ragged prompts (right-padded) longer than every sliding window; only real positions are compared."""
  model = jaxspec.load(dirs[variant], dtype=jnp.float32)
  rows = ragged_prompts((5, 24, 13), seed=1)
  want = _hf_logits(dirs[variant], rows)
  got = np.asarray(do.forward(model.params, model.config, jnp.asarray(padded(rows))))
  assert _max_error(got, want, rows) <= 1e-5 * np.abs(want).max()


# Each variant's own conventions, changed one at a time: the parity test above must notice every one of them.
_KNOBS = {
    "llama2": dict(rope=Rope(theta=500000.0)),
    "llama3": dict(rope=Rope(theta=500000.0)),  # llama3 scaling dropped
    "mistral": dict(layer_types=(FULL, FULL), sliding_window=None),
    "qwen2": dict(rope=Rope(theta=1000000.0)),  # linear scaling dropped
    "qwen3": dict(rms_norm_eps=0.5),  # also normalises q and k: a large eps shows up there
    "gemma2": dict(attn_logit_softcap=None),
    "gemma3": dict(local_rope=Rope(theta=1000000.0)),
}
_SHARED_KNOBS = {"gemma2": [dict(final_logit_softcap=None), dict(query_pre_attn_scalar=None),
                            dict(layer_types=(FULL,) * 3)],
                 "gemma3": [dict(layer_types=(SLIDING,) * 3), dict(query_pre_attn_scalar=None)]}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_convention_matters(dirs, variant):
  model = jaxspec.load(dirs[variant], dtype=jnp.float32)
  rows = ragged_prompts((5, 24, 13), seed=1)
  want = _hf_logits(dirs[variant], rows)
  for change in [_KNOBS[variant]] + _SHARED_KNOBS.get(variant, []):
    cfg = dataclasses.replace(model.config, **change)
    got = np.asarray(do.forward(model.params, cfg, jnp.asarray(padded(rows))))
    error = float(_max_error(got, want, rows))
    assert error > 1e-3 * np.abs(want).max(), (change, error)


def test_family_conventions_are_read(dirs):
  cfg = {v: jaxspec.load(d).config for v, d in dirs.items()}
  assert (cfg["llama2"].tie_word_embeddings, cfg["llama3"].tie_word_embeddings) == (False, True)
  assert cfg["llama3"].rope == Rope(theta=500000.0, kind="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=64)
  assert cfg["llama3"].qkv_bias and cfg["llama3"].o_bias and not cfg["llama2"].qkv_bias
  assert cfg["mistral"].layer_types == (SLIDING, SLIDING) and cfg["mistral"].sliding_window == 5
  assert cfg["qwen2"].qkv_bias and not cfg["qwen2"].o_bias and cfg["qwen2"].rope.kind == "linear"
  assert cfg["qwen3"].qk_norm and cfg["qwen3"].head_dim == 16 and not cfg["qwen3"].qkv_bias
  g2, g3 = cfg["gemma2"], cfg["gemma3"]
  assert (g2.attn_logit_softcap, g2.final_logit_softcap, g2.query_pre_attn_scalar) == (3.0, 4.0, 12)
  assert g2.layer_types == (SLIDING, FULL, SLIDING) and g2.norm_offset == 1.0 and g2.scale_embeddings
  assert g3.local_rope == Rope(theta=100.0) and g3.rope == Rope(theta=1000000.0, kind="linear", factor=4.0)
  assert g3.qk_norm and g3.final_logit_softcap is None and g3.sandwich_norms
  assert all(c.pad_token_id == 0 and c.eos_token_ids == (2,) for c in cfg.values())


def _continuations(vocab, rows, n, seed):
  rng = np.random.RandomState(seed)
  return [r + rng.randint(6, vocab, size=n).tolist() for r in rows]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_incremental_decoding_matches_full_pass(dirs, variant):
  """prefill + 1-token steps + blocks of gamma + 1 at ragged per-row offsets, each block first fed as junk and
  rolled back, equal the logits of one full pass over prompt + continuation."""
  model = jaxspec.load(dirs[variant], dtype=jnp.float32)
  cfg, params = model.config, model.params
  prompts = ragged_prompts((3, 11, 16), seed=2)
  n_new = 14
  full_rows = _continuations(cfg.vocab_size, prompts, n_new, seed=3)
  full = np.asarray(do.forward(params, cfg, jnp.asarray(padded(full_rows))))
  # Loop token t of row b is full_rows[b][len_b - 1 + t]; its logits are full[b, len_b - 1 + t].
  lens = np.array([len(p) for p in prompts])
  want = [full[b, lens[b] - 1:lens[b] - 1 + n_new + 1] for b in range(3)]
  toks = [full_rows[b][lens[b] - 1:] for b in range(3)]

  gamma = 3
  decoder = do.CausalDecoder(cfg)
  out = jax.jit(decoder.prefill, static_argnums=3)(params, jnp.asarray(padded(prompts, 16)),
                                                   jnp.asarray(lens, jnp.int32), n_new + gamma + 2)
  cache, first = out.cache, out.first
  assert first.tolist() == [p[-1] for p in prompts] and cache.positions.tolist() == [0, 0, 0]
  jitted = jax.jit(decoder.step)
  step = lambda p, c, t: (lambda r: (r.logits, r.cache))(jitted(p, c, t))  # (logits, cache)
  got = [[] for _ in range(3)]
  for t in range(3):  # 1-token steps
    logits, cache = step(params, cache, jnp.asarray([[toks[b][t]] for b in range(3)]))
    for b in range(3):
      got[b].append(np.asarray(logits[b, 0]))
  rng = np.random.RandomState(4)
  for k in ([3, 1, 4], [4, 4, 2], [2, 3, 4]):  # true tokens kept per row in each gamma + 1 block
    pos = np.asarray(cache.positions)
    _, cache = step(params, cache, jnp.asarray(rng.randint(6, cfg.vocab_size, size=(3, gamma + 1))))
    cache = cache.rollback(jnp.asarray(pos))  # a rejected block leaves no trace
    block = rng.randint(6, cfg.vocab_size, size=(3, gamma + 1))
    for b in range(3):
      block[b, :k[b]] = toks[b][pos[b]:pos[b] + k[b]]
    logits, cache = step(params, cache, jnp.asarray(block))
    for b in range(3):
      got[b].extend(np.asarray(logits[b, :k[b]]))
    cache = cache.rollback(jnp.asarray(pos + np.asarray(k)))
  scale = np.abs(full).max()
  for b in range(3):
    n = len(got[b])
    np.testing.assert_allclose(np.stack(got[b]), want[b][:n], atol=2e-5 * scale, rtol=0)
