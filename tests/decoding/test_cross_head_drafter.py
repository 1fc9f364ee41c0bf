"""A T5 target's feature head (jaxspec.decoding.drafters.cross_head_drafter, jaxspec.models.eagle3.cross)
drafting inside the loop: exact greedy output, the head's cache (self-attention entries and encoder keys / values) against a fresh
prefill after rollbacks, save / load, and the refusals. Lossless sampling: test_cross_head_sampling.py.

The greedy tests use a tiny random T5 (1 encoder layer, 3 decoder layers, untied lm_head) whose decoder layers
write little through self-attention and the MLP but read the source through a full-strength cross-attention: rows
of different inputs decode differently and end at different times. The head's lm_head is fitted (least squares)
to the target's own greedy outputs on the test inputs, from the head's pre-norm outputs of the real features: its
first drafts are often right, its later chain drafts rarely, so the tests see accepted and rejected drafts.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.device import loop, sampling, schedules
from jaxspec.decoding.drafters.cross_head_drafter import CrossHeadDrafter
from jaxspec.errors import CheckpointError
from jaxspec.models import eagle3, t5
from jaxspec.models.decoder_only.llama import LlamaConfig


V, D, DV = 16, 32, 12  # vocabulary, d_model (= the head's hidden size), the head's draft vocabulary
EOS = 7  # reached by some rows early (one inside a block), by others never: rows end at different times
PROMPTS = [[3, 5, 7, 9, 11, 1], [4, 6, 1], [8, 2, 12, 1], [2, 1], [14, 13, 12, 11, 10, 3, 7, 1], [6, 6, 6, 1]]
AUX = (0, 1, 2)  # feature indices 1, 2, 3 (3 = the decoder's final pre-norm output)


def _t5_config(d_model: int = D, eos: int = EOS) -> t5.T5Config:
  return t5.T5Config(vocab_size=V, d_model=d_model, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=3,
                     num_heads=4, tie_word_embeddings=False, scale_decoder_outputs=False, eos_token_id=eos,
                     pad_token_id=0, decoder_start_token_id=0)


def _target(d_model: int = D, mix: float = 0.1) -> jaxspec.Model:
  cfg = _t5_config(d_model)
  p = t5.init_params(cfg, jax.random.PRNGKey(0))
  p["decoder"]["layers"] = [dict(l, self_attention=dict(l["self_attention"], o=l["self_attention"]["o"] * mix),
                                 mlp=dict(l["mlp"], wo=l["mlp"]["wo"] * mix)) for l in p["decoder"]["layers"]]
  return jaxspec.Model(cfg, p, name="tiny-t5")


def _head_config() -> eagle3.Eagle3Config:
  return eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=DV, hidden_size=D, target_hidden_size=D,
                             intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=AUX,
                             encoder_hidden_size=D)


def _padded(rows: list[list[int]]) -> jax.Array:
  width = max(map(len, rows))
  return jnp.asarray([r + [0] * (width - len(r)) for r in rows], jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _teacher_forced_fn(decoder, layers, params, inputs, decoded):
  out = decoder.prefill(params, inputs, jnp.sum(inputs != 0, axis=1), decoded.shape[1], layers=layers, encoder=True)
  return out.encoder, decoder.step(params, out.cache, decoded, layers=layers).features


def _teacher_forced(target: jaxspec.Model, inputs: list[list[int]], decoded: list[list[int]],
                    layers: tuple[int, ...]):
  """The target's encoder output ((encoded [B, S, D], mask [B, S]) for the inputs, right-padded) and its decoder
  features [B, n, F] of the decoder tokens `decoded` (start token first, right-padded: the decoder is causal, so
  the padding changes no real position's features), in one call."""
  return _teacher_forced_fn(target.decoder(), layers, target.params, _padded(inputs), _padded(decoded))


@functools.partial(jax.jit, static_argnums=(0,))
def _head_prefill(cfg, params, embed, features, decoded, lengths, encoded, mask):
  """eagle3.prefill_hidden over whole decoder rows [B, n] with the head's encoder keys and values."""
  kv = eagle3.encoder_kv(params, cfg, encoded, mask)
  return eagle3.prefill_hidden(params, cfg, embed, features, decoded, lengths, 4, encoder=kv)


@functools.lru_cache(maxsize=None)
def _pair() -> tuple[jaxspec.Model, jaxspec.FeatureHead]:
  """The target and a head whose lm_head is fitted to the target's greedy outputs (the module docstring)."""
  target = _target()
  plain = jaxspec.generate(target, PROMPTS, max_new_tokens=16)
  cfg = _head_config()
  params = eagle3.init_params(cfg, jax.random.PRNGKey(1), std=0.02)
  seqs = [[0] + plain.tokens[b, :plain.lengths[b]].tolist() for b in range(len(PROMPTS))]
  counts = np.bincount(np.concatenate(seqs), minlength=V)
  ids = np.sort(np.argsort(-counts, kind="stable")[:DV])
  d2t, t2d = eagle3.vocab_maps(ids, V)
  params = {**params, "d2t": jnp.asarray(d2t), "t2d": jnp.asarray(t2d)}
  layers = cfg.feature_layers(3)
  xs, ys = [], []
  (encoded, mask), features = _teacher_forced(target, PROMPTS, seqs, layers)
  _, prenorms = _head_prefill(cfg, params, target.params["shared"]["embedding"], features, _padded(seqs),
                              jnp.asarray([len(q) for q in seqs]), encoded, mask)
  for seq, prenorm in zip(seqs, np.asarray(prenorms)):
    n = len(seq)
    x = prenorm[:n - 2]
    xs.append(x / np.sqrt((x ** 2).mean(-1, keepdims=True) + cfg.rms_norm_eps))
    for s in range(n - 2):
      y = np.full((DV,), -1.0, np.float32)
      if seq[s + 2] in ids:
        y[np.searchsorted(ids, seq[s + 2])] = 4.0
      ys.append(y)
  lm_head = np.linalg.lstsq(np.concatenate(xs), np.stack(ys), rcond=None)[0]
  params = {**params, "lm_head": jnp.asarray(lm_head, jnp.float32)}
  return target, jaxspec.FeatureHead(cfg, params, name="tiny-t5-head")


def test_greedy_equals_plain():
  """Ragged inputs, rows ending by EOS (inside a multi-token block) and by max_new_tokens at different times.
  (With a schedule that rests the batch: test_head_cache_equals_a_fresh_prefill.)"""
  target, head = _pair()
  plain = jaxspec.generate(target, PROMPTS, max_new_tokens=16)
  out = jaxspec.generate(target, PROMPTS, jaxspec.Speculation(head, gamma=3), max_new_tokens=16)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  lengths = plain.lengths.tolist()
  assert len(set(lengths)) >= 3 and 16 in lengths and min(lengths) < 16  # rows finish at different times
  stats = out.stats
  assert 0 < stats.accepted.sum() < stats.drafted.sum()
  by_eos = out.lengths < 16  # some row ending by EOS had its block cut at an accepted EOS draft
  assert np.any(by_eos & (stats.accepted + stats.iterations > stats.generated))


def test_trees_from_the_head_equal_plain_and_its_chain():
  """The head grows token trees (EAGLE-2's rule) with its cross-attention: greedy output equal to plain decoding,
  and a one-child tree equal to the head's chain token for token (same drafts: the tree step reads the encoder)."""
  target, head = _pair()
  plain = jaxspec.generate(target, PROMPTS, max_new_tokens=16)
  out = jaxspec.generate(target, PROMPTS, jaxspec.Speculation(head, gamma=3, tree=jaxspec.Tree(top_k=2, nodes=5)),
                         max_new_tokens=16)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  assert out.stats.accepted.sum() > 0
  chain, _, _, _ = _run_loop(target, head, "constant")
  one, _, _, _ = _run_loop(target, head, "constant", tree=jaxspec.Tree(top_k=1, nodes=3))  # the tree machinery
  for field in ("sequences", "lengths"):
    np.testing.assert_array_equal(getattr(one, field), getattr(chain, field))
  np.testing.assert_array_equal(one.stats.accepted, chain.stats.accepted)
  assert int(chain.stats.accepted.sum()) > 0


def test_the_tuner_measures_a_t5_head():
  """`jaxspec.tune` (launch/tune.py) times a T5 target's head: its cost probes give the head its encoder output
  (they once built a drafter without cross-attention and failed), and its rows decode exactly."""
  target, head = _pair()
  result = jaxspec.tune(target, {"head": head}, PROMPTS[:2], gammas=(2,), schedules=("constant",), repeats=1,
                        max_new_tokens=6, itl=False, min_speedup=0.0, verbose=False)
  (row,) = result.rows
  assert row["draft"] == "head" and row["identical_to_plain"] is True
  assert row["c"] > 0 and row["r"] > 0


def test_the_encoder_matters_to_the_head():
  """The head's drafts read the source: the same decoder state with another encoder output gives other logits
  (a head that ignored its cross-attention would pass the exactness tests too)."""
  target, head = _pair()
  cfg, params = head.config, head.params
  decoded = [[0, 5], [0, 5]]
  (encoded, mask), features = _teacher_forced(target, [PROMPTS[0], PROMPTS[4]], decoded, cfg.feature_layers(3))
  kv = eagle3.encoder_kv(params, cfg, encoded, mask)
  cache = eagle3.init_cache(cfg, 2, 4, jnp.float32, kv)
  same = jnp.concatenate([features[:1, :1]] * 2)  # both rows: row 0's decoder features, only the source differs
  out, _, _ = eagle3.step(params, cfg, target.params["shared"]["embedding"], cache, eagle3.fuse(params, cfg, same),
                          jnp.asarray([[5], [5]]))
  logits = np.asarray(out)
  finite = np.isfinite(logits[0])  # -inf outside the draft vocabulary, on both sides
  np.testing.assert_array_equal(finite, np.isfinite(logits[1]))
  assert np.abs(logits[0][finite] - logits[1][finite]).max() > 1e-3


def _run_loop(target, head, schedule, spec=None, max_new_tokens=16, tree=None):
  """The loop run directly on PROMPTS (greedy; `tree`: the loop's tree setting, even top_k 1, which `generate`
  would run as a chain): (final state, settings, draft params, ids)."""
  cfg = head.config
  layers = eagle3.check_fits(cfg, target.config, head.params)
  settings = loop.LoopSettings(target=target.decoder(), drafter=CrossHeadDrafter(eagle3.Eagle3Head(cfg), layers, V),
                               gamma=3, max_new_tokens=max_new_tokens, greedy=True, filtering=False,
                               eos_ids=(EOS,), pad_id=0, schedule=schedule, tree=tree)
  width = max(map(len, PROMPTS))
  ids = jnp.asarray([p + [0] * (width - len(p)) for p in PROMPTS], jnp.int32)
  lengths = jnp.asarray([len(p) for p in PROMPTS], jnp.int32)
  params = {"head": head.params, "embed": target.params["shared"]["embedding"]}
  tc, dc, first = jax.jit(loop.prefill, static_argnums=0)(settings, target.params, params, ids, lengths)
  rows = len(PROMPTS)
  state = jax.jit(loop.run, static_argnums=0)(settings, target.params, params, tc, dc, first,
                                              sampling.SamplingKnobs.create(0.0, 0, 1.0),
                                              np.zeros((rows,), np.uint32), np.arange(rows, dtype=np.int32), spec)
  return state, settings, params, ids


def test_head_cache_equals_a_fresh_prefill():
  """The loop under "adaptive" (drafting iterations with rollbacks of rejected drafts, resting ones, probes) gives
  the plain greedy output, and after it every row's head cache holds,
  for its positions < L - 1, the keys and values a fresh head prefill of start token + output computes from the
  target's features; its `hidden` is that prefill's pre-norm output at the last entry; its encoder keys and values
  are those of the target's encoder output, untouched by the rollbacks."""
  target, head = _pair()
  spec = schedules.SpeculationKnobs.create(fallback_alpha=0.5, prior_alpha=0.6, probe_interval=1,
                                          draft_confidence=0.3)
  state, settings, params, ids = _run_loop(target, head, "adaptive", spec)
  assert int(state.stats.fallback_iterations.sum()) > 0 and int(state.stats.drafted.sum()) > 0
  assert 0 < int(state.stats.accepted.sum()) < int(state.stats.drafted.sum())
  cache, hidden = state.draft_state.cache, np.asarray(state.draft_state.hidden)
  seqs, lens = np.asarray(state.sequences), np.asarray(state.lengths)
  plain = jaxspec.generate(target, PROMPTS, max_new_tokens=16)
  np.testing.assert_array_equal(lens - 1, plain.lengths)
  for b in range(len(PROMPTS)):
    np.testing.assert_array_equal(seqs[b, 1:lens[b]], plain.tokens[b, :plain.lengths[b]])
  np.testing.assert_array_equal(np.asarray(cache.positions), lens - 1)
  cfg = head.config
  full = [seqs[b, :lens[b]].tolist() for b in range(len(PROMPTS))]  # the loop's token 0 is the decoder start token
  (encoded, mask), features = _teacher_forced(target, PROMPTS, full, settings.drafter.feature_layers)
  kv = eagle3.encoder_kv(params["head"], cfg, encoded, mask)
  np.testing.assert_array_equal(np.asarray(cache.encoder.mask), np.asarray(kv.mask))
  for a, b in ((cache.encoder.k, kv.k), (cache.encoder.v, kv.v)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)
  fresh, prenorm = _head_prefill(cfg, params["head"], params["embed"], features, _padded(full),
                                 jnp.asarray(lens), encoded, mask)
  for b in range(len(PROMPTS)):
    n = int(lens[b])
    assert int(cache.lengths[b]) == int(fresh.lengths[b]) == n - 1
    np.testing.assert_allclose(np.asarray(cache.k[b, :n - 1]), np.asarray(fresh.k[b, :n - 1]), atol=2e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(cache.v[b, :n - 1]), np.asarray(fresh.v[b, :n - 1]), atol=2e-4, rtol=0)
    if n >= 2:
      np.testing.assert_allclose(hidden[b], np.asarray(prenorm[b, n - 2]), atol=2e-4, rtol=0)


def test_save_load_round_trip(tmp_path):
  """jaxspec.save writes SpecForge's format extended by the cross-attention tensors and architectures
  ["T5Eagle3Head"]; jaxspec.load reads it back as a FeatureHead that decodes the same."""
  target, head = _pair()
  jaxspec.save(head, str(tmp_path / "head"))
  raw = __import__("json").loads((tmp_path / "head" / "config.json").read_text())
  assert raw["architectures"] == ["T5Eagle3Head"] and raw["encoder_hidden_size"] == D
  loaded = jaxspec.load(str(tmp_path / "head"), dtype=jnp.float32)
  assert isinstance(loaded, jaxspec.FeatureHead) and loaded.config == head.config
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded.params, head.params)
  a = jaxspec.generate(target, PROMPTS[:3], jaxspec.Speculation(loaded, gamma=2), max_new_tokens=8)
  b = jaxspec.generate(target, PROMPTS[:3], jaxspec.Speculation(head, gamma=2), max_new_tokens=8)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.stats.accepted, b.stats.accepted)


def test_a_file_without_cross_attention_tensors_is_refused(tmp_path):
  """A T5 head's directory that lost a cross-attention tensor, or whose config lost encoder_hidden_size."""
  import json
  from jaxspec.checkpoint.safetensors_io import save_file
  _, head = _pair()
  path = tmp_path / "head"
  jaxspec.save(head, str(path))
  tensors = eagle3.to_state_dict(head.config, head.params)
  del tensors["midlayer.cross_attn.k_proj.weight"]
  save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(CheckpointError, match="lacks tensors.*cross_attn.k_proj"):
    jaxspec.load(str(path))
  raw = json.loads((path / "config.json").read_text())
  del raw["encoder_hidden_size"]
  (path / "config.json").write_text(json.dumps(raw))
  with pytest.raises(CheckpointError, match="needs encoder_hidden_size"):
    jaxspec.load(str(path))


def test_a_head_for_another_target_is_refused():
  """One CheckpointError naming the mismatch, before anything runs: a decoder-only target; a T5 of another size."""
  _, head = _pair()
  llama = jaxspec.Model.random(LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=64, num_layers=4,
                                           num_heads=4, num_kv_heads=2, head_dim=8, eos_ids=(EOS,), pad_token_id=0,
                                           bos_token_id=None))
  with pytest.raises(CheckpointError, match="does not fit this target.*T5 .*target is decoder-only"):
    jaxspec.generate(llama, PROMPTS[:2], jaxspec.Speculation(head, gamma=2), max_new_tokens=4)
  wider = jaxspec.Model.random(_t5_config(d_model=48))
  with pytest.raises(CheckpointError, match="does not fit this target.*encoder outputs 32 wide.*48 wide"):
    jaxspec.generate(wider, PROMPTS[:2], jaxspec.Speculation(head, gamma=2), max_new_tokens=4)
  with pytest.raises(ValueError, match="decoder-only target's head drafts with HeadDrafter"):
    CrossHeadDrafter(eagle3.Eagle3Head(eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=DV, hidden_size=D,
                                                           target_hidden_size=D, intermediate_size=64,
                                                           num_heads=4, num_kv_heads=2, head_dim=8)), (1, 2, 3), V)
