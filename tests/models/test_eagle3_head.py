"""The EAGLE-3 head (jaxspec.models.eagle3) against SpecForge's LlamaForCausalLMEagle3 (torch, CPU) on tiny random
heads written by its save_pretrained; the head directory's round trip; the fit and vocabulary checks; the head's
KV cache (a rolled-back block leaves no trace)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.checkpoint.safetensors_io import SafetensorsFile, save_file
from jaxspec.errors import CheckpointError
from jaxspec.checkpoint import head_dir
from jaxspec.models import eagle3
from jaxspec.models.decoder_only.llama import LlamaConfig

VOCAB, DRAFT_VOCAB, HIDDEN = 128, 64, 32

# name -> LlamaConfig kwargs and head extras. "extras": a feature width other than the head's, fc_norm, no output
# norm, llama3 RoPE scaling and aux layer ids: each reference option the loader must read.
HEADS = {
    "plain": dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0),
    "extras": dict(num_attention_heads=2, num_key_value_heads=1, target_hidden_size=24, fc_norm=True,
                   norm_output=False, rope_theta=500000.0,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8),
                   eagle_config=dict(eagle_aux_hidden_state_layer_ids=[0, 2, 3])),
}


def _reference_class():
  """specforge's head class. specforge declares sglang among its dependencies: install the reference alone with
  `pip install --no-deps specforge==0.2.0` (it needs only torch and transformers; the README's test command and
  .ci/run do that)."""
  import torch
  torch._dynamo.config.disable = True  # The reference compiles its RoPE and RMSNorm; eager is exact and quick.
  from specforge.modeling.draft import llama3_eagle  # pylint: disable=import-outside-toplevel
  return llama3_eagle.LlamaForCausalLMEagle3


def write_reference_head(directory: str, name: str, seed: int = 0):
  """A random SpecForge head (weights at a scale that makes logits far from uniform, a random draft vocabulary
  with consistent d2t / t2d) written by its save_pretrained; returns the torch model."""
  import torch
  from transformers import LlamaConfig as HFLlamaConfig
  spec = dict(HEADS[name])
  extras = {k: spec.pop(k) for k in ("target_hidden_size", "fc_norm", "norm_output", "eagle_config") if k in spec}
  cfg = HFLlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1,
                      max_position_embeddings=256, rms_norm_eps=1e-6, **spec)
  cfg.draft_vocab_size = DRAFT_VOCAB
  cfg.architectures = ["LlamaForCausalLMEagle3"]
  for key, value in extras.items():
    setattr(cfg, key, value)
  torch.manual_seed(seed)
  model = _reference_class()(cfg).eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for pname, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.1 * noise if "norm" in pname else noise if "embed" in pname else 0.2 * noise)
    ids = np.sort(np.random.RandomState(seed).choice(VOCAB, DRAFT_VOCAB, replace=False))
    d2t, t2d = eagle3.vocab_maps(ids, VOCAB)
    model.d2t.copy_(torch.tensor(d2t, dtype=torch.int64))
    model.t2d.copy_(torch.tensor(t2d))
  model.save_pretrained(directory)
  return model


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
  """{name: (directory, torch model)}."""
  root = tmp_path_factory.mktemp("eagle3")
  return {name: (str(root / name), write_reference_head(str(root / name), name)) for name in HEADS}


def _head_step(head):
  """(params, embed, cache, hidden, tokens) -> (logits, prenorm, cache): the head's `Decoder.step`, jitted."""
  def call(p, e, c, h, t):
    res = head.step({"head": p, "embed": e}, c, eagle3.HeadInput(t, h))
    return res.logits, res.features, res.cache
  return jax.jit(call)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_logits_match_specforge(heads, name):
  """First step over 6 entries (feature t, token t + 1) and a second step fed with the head's own pre-norm output
  (token t + 2), as SpecForge's training unroll runs them: the second step's entry t attends to the first step's
  entries 0..t and to itself, at position t + 1."""
  import torch
  directory, ref = heads[name]
  cfg, params = head_dir.load(directory)
  assert cfg.target_hidden_size == HEADS[name].get("target_hidden_size", HIDDEN)
  rng = np.random.RandomState(1)
  batch, width = 2, 6
  features = rng.randn(batch, width, 3 * cfg.target_hidden_size).astype(np.float32)
  ids = rng.randint(0, VOCAB, size=(batch, width + 2))
  first_tokens, second_tokens = ids[:, 1:width + 1], ids[:, 2:width + 2]

  with torch.no_grad():
    g = ref.project_hidden_states(torch.tensor(features))
    mask = ref.prepare_decoder_attention_mask(torch.ones(batch, width, dtype=torch.bool), g, batch, width, 0)
    positions = torch.arange(width)[None]
    unroll = [[], []]  # the reference's cache of the unrolled steps' keys and values
    out0 = ref.backbone(ref.embed_input_ids(torch.tensor(first_tokens)), g, unroll, mask, positions)
    out1 = ref.backbone(ref.embed_input_ids(torch.tensor(second_tokens)), out0, unroll, mask, positions)
    want0, want1 = ref.compute_logits(out0).numpy(), ref.compute_logits(out1).numpy()

  head = eagle3.Eagle3Head(cfg)
  embed = eagle3.embedding_table(params, None)
  step = _head_step(head)
  cache = eagle3.init_cache(cfg, batch, width + 2, jnp.float32)
  g_ours = head.fuse(params, jnp.asarray(features))
  np.testing.assert_allclose(np.asarray(g_ours), g.numpy(), atol=1e-5 * np.abs(g.numpy()).max(), rtol=0)
  logits0, prenorm0, cache = step(params, embed, cache, g_ours, jnp.asarray(first_tokens))
  target_ids = np.flatnonzero(np.asarray(params["t2d"]))
  assert np.all(np.isneginf(np.delete(np.asarray(logits0), target_ids, axis=-1)))
  scale = np.abs(want0).max()
  np.testing.assert_allclose(np.asarray(logits0)[..., target_ids], want0, atol=1e-5 * scale, rtol=0)
  np.testing.assert_allclose(np.asarray(prenorm0), out0.numpy(), atol=1e-5 * np.abs(out0.numpy()).max(), rtol=0)
  for t in range(width):
    kept = cache.rollback(jnp.full((batch,), t + 1, jnp.int32))
    logits1, _, _ = step(params, embed, kept, prenorm0[:, t:t + 1], jnp.asarray(second_tokens[:, t:t + 1]))
    np.testing.assert_allclose(np.asarray(logits1)[:, 0, target_ids], want1[:, t], atol=1e-5 * scale, rtol=0)


def test_save_load_round_trip(heads, tmp_path):
  """load -> save -> load gives the same config and parameters; the reference reads the saved directory back to
  the same tensors; a head without embed_tokens loads and embeds with the target's table."""
  import torch
  for name, (directory, ref) in heads.items():
    cfg, params = head_dir.load(directory)
    out = str(tmp_path / name)
    head_dir.save(out, cfg, params)
    cfg2, params2 = head_dir.load(out)
    assert cfg2 == cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)
    reread = _reference_class().from_pretrained(out).eval()
    for key, value in ref.state_dict().items():
      torch.testing.assert_close(reread.state_dict()[key], value, rtol=0, atol=0)

  cfg, params = head_dir.load(heads["plain"][0])
  without = {k: v for k, v in params.items() if k != "embedding"}
  head_dir.save(str(tmp_path / "no_embed"), cfg, without)
  assert "embed_tokens.weight" not in SafetensorsFile(str(tmp_path / "no_embed" / "model.safetensors")).keys()
  cfg2, params2 = head_dir.load(str(tmp_path / "no_embed"))
  assert "embedding" not in params2
  target_embedding = jnp.ones((VOCAB, HIDDEN))
  assert eagle3.embedding_table(params2, target_embedding) is target_embedding


def _own_heads(root) -> dict[str, str]:
  """The two kinds of head of HEADS written by `head_dir.save` (no reference needed): {name: directory}."""
  small = dict(vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB, hidden_size=HIDDEN, intermediate_size=64)
  configs = {"plain": eagle3.Eagle3Config(**small, target_hidden_size=HIDDEN, num_heads=4, num_kv_heads=2,
                                          head_dim=8),
             "extras": eagle3.Eagle3Config(**small, target_hidden_size=24, num_heads=2, num_kv_heads=1, head_dim=16,
                                           fc_norm=True, norm_output=False, aux_layer_ids=(0, 2, 3))}
  out = {}
  for name, cfg in configs.items():
    out[name] = str(root / name)
    head_dir.save(out[name], cfg, eagle3.init_params(cfg, jax.random.PRNGKey(0), with_embedding=True))
  return out


@pytest.fixture(scope="module")
def own_heads(tmp_path_factory):
  return _own_heads(tmp_path_factory.mktemp("own_heads"))


def _target(**change) -> LlamaConfig:
  sizes = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_layers=6, num_heads=4, num_kv_heads=2,
               head_dim=8)
  return LlamaConfig(**{**sizes, **change})


def test_fits_and_bad_targets(own_heads):
  cfg, params = head_dir.load(own_heads["plain"])
  assert eagle3.check_fits(cfg, _target(), params) == (2, 3, 3)  # the default: inputs of layers 2, L // 2, L - 3
  extras, extras_params = head_dir.load(own_heads["extras"])
  assert eagle3.check_fits(extras, _target(hidden_size=24), extras_params) == (1, 3, 4)  # aux ids + 1
  cases = [
      (cfg, _target(hidden_size=48), params, "target_hidden_size"),  # a head for another target: hidden size
      (cfg, _target(vocab_size=256), params, "vocab_size"),  # ... or vocabulary
      (extras, _target(hidden_size=24, num_layers=3), extras_params, "aux layer ids"),  # id 3 of 3 layers
      (cfg, _target(num_layers=2), params, "at least 3 layers"),
      (extras, _target(hidden_size=24), {k: v for k, v in extras_params.items() if k != "embedding"},
       "no embedding of its own"),
      (cfg, _target(), {k: v for k, v in params.items() if k != "t2d"}, "d2t / t2d"),
      (cfg, _target(), {**params, "t2d": params["t2d"].at[np.flatnonzero(~np.asarray(params["t2d"]))[0]].set(True)},
       "disagree"),
      (cfg, _target(), {**params, "d2t": params["d2t"].at[-1].set(VOCAB)}, "outside"),
  ]
  for head_cfg, target, head_params, reason in cases:
    with pytest.raises(CheckpointError, match=reason) as error:
      eagle3.check_fits(head_cfg, target, head_params)
    assert str(error.value).count(";") == 0, error.value  # one problem, one message


def _rewrite(directory: str, out: str, edit) -> str:
  """A copy of a head directory with its tensors changed by edit(dict)."""
  os.makedirs(out)
  tensors = {k: np.array(v) for k, v in
             ((k, SafetensorsFile(os.path.join(directory, "model.safetensors")).get(k))
              for k in SafetensorsFile(os.path.join(directory, "model.safetensors")).keys())}
  edit(tensors)
  save_file(tensors, os.path.join(out, "model.safetensors"))
  with open(os.path.join(directory, "config.json")) as f, open(os.path.join(out, "config.json"), "w") as g:
    g.write(f.read())
  return out


def test_bad_head_directories(own_heads, tmp_path):
  directory = own_heads["plain"]
  def flip(t):
    t["t2d"][np.flatnonzero(~t["t2d"])[0]] = True
  cases = {"no_d2t": (lambda t: t.pop("d2t"), r"lacks tensors \['d2t'\]"),
           "no_t2d": (lambda t: t.pop("t2d"), r"lacks tensors \['t2d'\]"),
           "t2d_disagrees": (flip, "disagree"),
           "d2t_out_of_range": (lambda t: t["d2t"].__setitem__(-1, VOCAB), "outside"),
           "bad_shape": (lambda t: t.__setitem__("fc.weight", t["fc.weight"][:, :64]), "fc.weight")}
  for case, (edit, reason) in cases.items():
    with pytest.raises(CheckpointError, match=reason):
      head_dir.load(_rewrite(directory, str(tmp_path / case), edit))
  with open(os.path.join(directory, "config.json")) as f:
    raw = json.load(f)
  with pytest.raises(CheckpointError, match="not an EAGLE-3 head"):
    eagle3.Eagle3Config.from_hf_dict({**raw, "architectures": ["LlamaForCausalLM"]})


def _rows(array: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
  """array[b, starts[b]:starts[b] + n] per row."""
  return np.stack([array[b, s:s + n] for b, s in enumerate(starts)])


def test_cache_rollback_equals_fresh_prefill():
  """prefill (ragged prompts) + a junk block rolled back + the true block + one more entry gives the logits and
  keys of a fresh prefill of the longer sequence + that entry."""
  cfg = eagle3.Eagle3Config(vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB, hidden_size=HIDDEN,
                            target_hidden_size=HIDDEN, intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8)
  params = eagle3.init_params(cfg, jax.random.PRNGKey(0), std=0.2)
  head = eagle3.Eagle3Head(cfg)
  embed = jax.random.normal(jax.random.PRNGKey(1), (VOCAB, HIDDEN))
  rng = np.random.RandomState(2)
  lens = np.array([3, 6])
  features = rng.randn(2, 12, 3 * HIDDEN).astype(np.float32)
  ids = rng.randint(0, VOCAB, size=(2, 12))
  g = np.asarray(head.fuse(params, jnp.asarray(features)))
  step = _head_step(head)

  cache = jax.jit(lambda p, e, f, i, n: eagle3.prefill(p, cfg, e, f, i, n, 6))(
      params, embed, jnp.asarray(features[:, :6]), jnp.asarray(ids[:, :6]), jnp.asarray(lens))
  assert cache.positions.tolist() == [0, 0] and cache.lengths.tolist() == (lens - 1).tolist()
  junk = rng.randn(2, 3, HIDDEN).astype(np.float32)
  _, _, cache = step(params, embed, cache, jnp.asarray(junk), jnp.asarray(rng.randint(0, VOCAB, size=(2, 3))))
  cache = cache.rollback(jnp.zeros((2,), jnp.int32))
  # The loop's entries at positions len - 1, len, len + 1: (feature p, token p + 1).
  _, _, cache = step(params, embed, cache, jnp.asarray(_rows(g, lens - 1, 3)), jnp.asarray(_rows(ids, lens, 3)))
  last = (jnp.asarray(_rows(g, lens + 2, 1)), jnp.asarray(_rows(ids, lens + 3, 1)))
  got, _, cache = step(params, embed, cache, *last)

  fresh = eagle3.prefill(params, cfg, embed, jnp.asarray(features[:, :9]), jnp.asarray(ids[:, :9]),
                         jnp.asarray(lens + 3), 6)
  want, _, fresh = step(params, embed, fresh, *last)
  assert cache.lengths.tolist() == fresh.lengths.tolist() == (lens + 3).tolist()
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5 * np.abs(np.asarray(want)[
      np.isfinite(np.asarray(want))]).max(), rtol=0)
  for b, n in enumerate(lens + 3):
    np.testing.assert_allclose(np.asarray(cache.k[b, :n]), np.asarray(fresh.k[b, :n]), atol=1e-5, rtol=0)


def test_target_features_feed_the_head(own_heads):
  """The pieces a drafter chains: check_fits gives the layers, the target's prefill(layers=...) fills the head's cache,
  the target's step(layers=...) of the loop's first tokens feed the head's first draft step, whose pre-norm output
  feeds the next."""
  from jaxspec.models import decoder_only as do
  cfg, params = head_dir.load(own_heads["plain"])
  target_cfg = _target()
  target_params = do.init_params(target_cfg, jax.random.PRNGKey(3))
  layers = eagle3.check_fits(cfg, target_cfg, params)
  target, head = do.CausalDecoder(target_cfg), eagle3.Eagle3Head(cfg)
  embed = eagle3.embedding_table(params, target_params["embedding"])
  ids = jnp.asarray(np.random.RandomState(4).randint(0, VOCAB, size=(2, 5)))
  lens = jnp.asarray([3, 5])
  out = target.prefill(target_params, ids, lens, 4, layers=layers)
  t_cache, first, feats = out.cache, out.first, out.features
  h_cache = head.prefill({"head": params, "embed": embed}, eagle3.HeadInput(ids, head.fuse(params, feats)), lens,
                         4).cache
  res = target.step(target_params, t_cache, first[:, None], layers=layers)
  logits, feats, t_cache = res.logits, res.features, res.cache
  emitted = jnp.argmax(logits[:, -1], axis=-1)
  step = _head_step(head)
  q, prenorm, h_cache = step(params, embed, h_cache, head.fuse(params, feats), emitted[:, None])
  drafted = jnp.argmax(q[:, -1], axis=-1)
  assert bool(jnp.all(params["t2d"][drafted]))
  q2, _, h_cache = step(params, embed, h_cache, prenorm, drafted[:, None])
  assert q2.shape == (2, 1, VOCAB) and h_cache.positions.tolist() == [2, 2]
  # The target has fed the loop's first token (position len - 1); the head one entry more (its draft).
  assert t_cache.lengths.tolist() == [3, 5] and h_cache.lengths.tolist() == [4, 6]
