"""Target features for feature-head drafting (EAGLE-3): the hidden states entering chosen decoder layers, from
`prefill(..., layers=...)` and `step(..., layers=...)` of every family, against transformers' `output_hidden_states=True`; and
the plain `prefill` / `step` unchanged by them (their jaxprs' operation counts, recorded before features existed).

Feature index i is transformers' hidden_states[i] (the input of layer i) for i < L; index L is the final pre-norm
output, compared with the input of transformers' final norm (its hidden_states[L] is after that norm).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec.models import contract
from jaxspec.models import decoder_only as do
from jaxspec.models import t5
from jaxspec.models.decoder_only.config import FULL, SLIDING
from jaxspec.models.decoder_only.gemma import GemmaConfig
from jaxspec.models.decoder_only.llama import LlamaConfig

from conftest import load_hf_reference as load_hf_t5
from conftest import write_hf_t5
from decoder_only_models import load_hf_reference, padded, ragged_prompts, write_hf_decoder


def _hf_states(model, final_norm, **inputs) -> list[np.ndarray]:
  """transformers' hidden states [i] for i < L, plus the input of `final_norm` as entry L."""
  seen = []
  hook = final_norm.register_forward_hook(lambda module, args, out: seen.append(args[0].detach().numpy()))
  try:
    with torch.no_grad():
      out = model(**inputs, output_hidden_states=True)
  finally:
    hook.remove()
  states = out.decoder_hidden_states if hasattr(out, "decoder_hidden_states") else out.hidden_states
  return [s.numpy() for s in states[:-1]] + [seen[-1]]


def _concat(states, layers):
  return np.concatenate([states[i] for i in layers], axis=-1)


@pytest.mark.parametrize("variant", ["llama2", "qwen3", "gemma2"])
def test_decoder_only_features_match_transformers(tmp_path, variant):
  """Prompt features from prefill(layers=...), then a block of 3 tokens at per-row offsets from step(layers=...)."""
  directory = write_hf_decoder(str(tmp_path / variant), variant, with_tokenizer=False)
  model = jaxspec.load(directory, dtype=jnp.float32)
  cfg, params = model.config, model.params
  num_layers = cfg.num_layers
  layers = (num_layers, 0, 2, 1)  # any order; index L (the final pre-norm output) too
  prompts = ragged_prompts((3, 9, 6), seed=5)
  lens = np.array([len(p) for p in prompts])
  rng = np.random.RandomState(6)
  rows = [p + rng.randint(6, cfg.vocab_size, size=2).tolist() for p in prompts]  # prompt + 2 continuation tokens
  ids = padded(rows)
  ref = load_hf_reference(directory)
  want = _concat(_hf_states(ref, ref.model.norm, input_ids=torch.tensor(ids, dtype=torch.long),
                            attention_mask=torch.tensor(ids != 0, dtype=torch.long)), layers)
  scale = np.abs(want).max()

  decoder = do.CausalDecoder(cfg)
  assert isinstance(decoder, contract.Decoder)
  out = jax.jit(decoder.prefill, static_argnums=3, static_argnames="layers")(
      params, jnp.asarray(padded(prompts)), jnp.asarray(lens, jnp.int32), 4, layers=layers)
  cache, feats = out.cache, out.features
  assert feats.shape == (3, padded(prompts).shape[1], len(layers) * cfg.hidden_size)
  for b, n in enumerate(lens):
    np.testing.assert_allclose(np.asarray(feats[b, :n]), want[b, :n], atol=1e-5 * scale, rtol=0)

  # The loop's first block: each prompt's last token (at position len - 1) and the two continuation tokens.
  block = np.stack([np.asarray(rows[b][n - 1:n + 2]) for b, n in enumerate(lens)])
  res = jax.jit(decoder.step, static_argnames="layers")(params, cache, jnp.asarray(block), layers=layers)
  logits, feats, cache = res.logits, res.features, res.cache
  plain = decoder.step(params, decoder.prefill(params, jnp.asarray(padded(prompts)), jnp.asarray(lens), 4).cache,
                       jnp.asarray(block)).logits  # the same logits as the plain step (up to jit's float reordering)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(plain), atol=1e-5 * np.abs(plain).max(), rtol=0)
  assert cache.positions.tolist() == [3, 3, 3]
  for b, n in enumerate(lens):
    np.testing.assert_allclose(np.asarray(feats[b]), want[b, n - 1:n + 2], atol=1e-5 * scale, rtol=0)


def test_t5_decoder_features_match_transformers(tmp_path):
  """T5's decoder features from step(layers=...) at per-row offsets (a block fed, rolled back to [1, 2, 0], then
  another); prefill(layers=...) has none (the decoder starts empty)."""
  directory = write_hf_t5(str(tmp_path / "t5"), "t5_v1_1")
  model = jaxspec.load(directory, dtype=jnp.float32)
  cfg, params = model.config, model.params
  layers = (1, cfg.num_decoder_layers, 0)
  rng = np.random.RandomState(0)
  ids = rng.randint(2, cfg.vocab_size, size=(3, 9))
  ids[1, 5:] = 0
  dec = rng.randint(2, cfg.vocab_size, size=(3, 6))
  dec[:, 0] = cfg.decoder_start_token_id
  ref = load_hf_t5(directory)
  want = _concat(_hf_states(ref, ref.decoder.final_layer_norm, input_ids=torch.tensor(ids),
                            attention_mask=torch.tensor(ids != 0), decoder_input_ids=torch.tensor(dec)), layers)
  scale = np.abs(want).max()

  decoder = t5.T5Decoder(cfg)
  assert isinstance(decoder, contract.Decoder)
  out = decoder.prefill(params, jnp.asarray(ids), jnp.asarray([9, 5, 9]), 8, layers=layers)
  cache, none = out.cache, out.features
  assert none.shape == (3, 0, len(layers) * cfg.d_model)
  jitted = jax.jit(decoder.step, static_argnames="layers")
  step = lambda p, c, t, l: (lambda r: (r.logits, r.features, r.cache))(jitted(p, c, t, layers=l))
  _, feats, cache = step(params, cache, jnp.asarray(dec[:, :3]), layers)
  np.testing.assert_allclose(np.asarray(feats), want[:, :3], atol=1e-5 * scale, rtol=0)
  kept = np.array([1, 2, 0])
  cache = cache.rollback(jnp.asarray(kept))
  block = np.stack([dec[b, k:k + 3] for b, k in enumerate(kept)])
  logits, feats, cache = step(params, cache, jnp.asarray(block), layers)
  for b, k in enumerate(kept):
    np.testing.assert_allclose(np.asarray(feats[b]), want[b, k:k + 3], atol=1e-5 * scale, rtol=0)


def test_feature_layers_are_checked():
  cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
                    head_dim=4)
  params = do.init_params(cfg, jax.random.PRNGKey(0))
  cache = do.init_cache(cfg, 1, 4, jnp.float32)
  for bad in ((3,), (-1,), (0, 3)):
    with pytest.raises(ValueError, match="feature layers"):
      do.CausalDecoder(cfg).step(params, cache, jnp.ones((1, 1), jnp.int32), layers=bad)
  assert do.CausalDecoder(cfg).step(params, cache, jnp.ones((1, 1), jnp.int32)).features is None  # () : none


def _op_counts(fn, *args) -> collections.Counter:
  """Equations per primitive in fn's jaxpr, sub-jaxprs (jit, custom_jvp) included."""
  def walk(jaxpr, counts):
    for eqn in jaxpr.eqns:
      counts[eqn.primitive.name] += 1
      for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else [value]:
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner, counts)
    return counts
  return walk(jax.make_jaxpr(fn)(*args).jaxpr, collections.Counter())


# Operation counts of the plain calls, recorded with JAX 0.10.2 at the commit before features existed (408d8e2).
# A change here means `step` / `prefill` compute something new: features must cost nothing unless asked for.
# (A JAX upgrade may change how jnp functions lower: re-record then, from the plain calls of that commit.)
_RECORDED_JAX = "0.10.2"
_RECORDED = {
    "llama step": (215, dict(add=20, broadcast_in_dim=46, concatenate=8, dot_general=19, mul=33, scatter=4,
                             slice=8)),
    "llama prefill": (223, dict(add=20, broadcast_in_dim=50, concatenate=8, dot_general=18, mul=31, scatter=4,
                                slice=12)),
    "gemma2 step": (287, dict(add=37, broadcast_in_dim=57, concatenate=8, dot_general=19, mul=51, scatter=4,
                              tanh=5)),
    "t5 step": (249, dict(add=25, broadcast_in_dim=53, concatenate=4, dot_general=25, mul=15, scatter=4,
                          transpose=9)),
}


def _plain_calls():
  small = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
               head_dim=8)
  llama = LlamaConfig(**small)
  gemma = GemmaConfig(**small, model_type="gemma2", activation="gelu_pytorch_tanh", norm_offset=1.0,
                      scale_embeddings=True, sandwich_norms=True, query_pre_attn_scalar=8, attn_logit_softcap=50.0,
                      final_logit_softcap=30.0, sliding_window=4, layer_types=(SLIDING, FULL),
                      tie_word_embeddings=True)
  t5cfg = t5.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2)
  ids, lens, block = jnp.ones((2, 5), jnp.int32), jnp.array([3, 5], jnp.int32), jnp.ones((2, 3), jnp.int32)
  calls = {}
  for name, decoder, params in (("llama", do.CausalDecoder(llama), do.init_params(llama, jax.random.PRNGKey(0))),
                                ("gemma2", do.CausalDecoder(gemma), do.init_params(gemma, jax.random.PRNGKey(0))),
                                ("t5", t5.T5Decoder(t5cfg), t5.init_params(t5cfg, jax.random.PRNGKey(0)))):
    cache = decoder.prefill(params, ids, lens, 6).cache
    calls[f"{name} step"] = (decoder.step, params, cache, block)
    calls[f"{name} prefill"] = (lambda p, i, n, d=decoder: d.prefill(p, i, n, 6), params, ids, lens)
    calls[f"{name} step_features"] = (lambda p, c, t, d=decoder: d.step(p, c, t, layers=(0, 2)), params, cache,
                                      block)
  return calls


def test_plain_step_and_prefill_are_unchanged():
  if jax.__version__ != _RECORDED_JAX:
    pytest.skip(f"operation counts were recorded with JAX {_RECORDED_JAX}, this is {jax.__version__}")
  calls = _plain_calls()
  for name, (total, some) in _RECORDED.items():
    fn, *args = calls[name]
    counts = _op_counts(fn, *args)
    assert (sum(counts.values()), {k: counts[k] for k in some}) == (total, some), name
  # The negative control: asking for features does add operations (the count above can see them).
  for family in ("llama", "t5"):
    fn, *args = calls[f"{family} step_features"]
    assert sum(_op_counts(fn, *args).values()) > _RECORDED[f"{family} step"][0]
