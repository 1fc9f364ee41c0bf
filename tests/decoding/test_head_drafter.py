"""The EAGLE-3 head drafting inside the loop (jaxspec.decoding.drafters.head_drafter): exact greedy output, lossless
sampling, the head's cache against a fresh prefill, loading and saving through jaxspec.load / jaxspec.save.

The greedy tests use a tiny random Llama target whose layers write little into the residual stream (so its next
token depends mostly on the current one, through a map f) and a head built to know it: `fc` passes the feature
entering layer 1 (about the embedding of token p), and `lm_head` is solved so that the head's argmax is f(f(token
p)), the target's token p + 2. Its first draft is then sometimes right, later chain drafts rarely: the tests see
accepted and rejected drafts. The alignment itself (which feature meets which token) is checked exactly by
`test_head_cache_equals_a_fresh_prefill`, against eagle3's prefill (docs/heads.md, "Alignment").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.device import loop, sampling, schedules, verify
from jaxspec.decoding.drafters.head_drafter import HeadDrafter
from jaxspec.errors import CheckpointError
from jaxspec.models import decoder_only as do
from jaxspec.models import eagle3
from jaxspec.models.decoder_only.llama import LlamaConfig

from stub_models import MarkovFeatureDecoder, chi_square, chi_square_limit, exact_sequence_probs, np_warp

V, H, DV = 16, 32, 12  # target vocabulary, hidden size, the head's draft vocabulary
EOS = 4  # the target's fixed point f(4) = 4: rows reach it at different times, often as an accepted draft
PROMPTS = [[3, 5, 7, 9, 11], [4, 6], [8, 1, 12], [2], [14, 13, 12, 11, 10, 3, 7], [6, 6, 6]]


def _target(eos: int = EOS, mix: float = 0.05, seed: int = 0, hidden: int = H) -> jaxspec.Model:
  cfg = LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=64, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=8, eos_ids=(eos,), pad_token_id=0, bos_token_id=None)
  p = do.init_params(cfg, jax.random.PRNGKey(seed), std=1.0)
  p["layers"] = [dict(l, attention=dict(l["attention"], o=l["attention"]["o"] * mix / 4),
                      mlp=dict(l["mlp"], down=l["mlp"]["down"] * mix / 8)) for l in p["layers"]]
  return jaxspec.Model(cfg, p, name="tiny-llama")


def _head_config() -> eagle3.Eagle3Config:
  return eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=DV, hidden_size=H, target_hidden_size=H,
                             intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 1, 2))


@functools.lru_cache(maxsize=None)
def _pair(eos: int = EOS) -> tuple[jaxspec.Model, jaxspec.FeatureHead]:
  """The target and a head that knows its next-token map (the module docstring)."""
  target = _target(eos)
  f = np.asarray(jaxspec.generate(target, [[i] for i in range(V)], max_new_tokens=1).tokens[:, 0])
  cfg = _head_config()
  params = eagle3.init_params(cfg, jax.random.PRNGKey(1), std=0.02)
  ids = np.flatnonzero(np.asarray(params["t2d"]))
  fc = np.zeros((3 * H, H), np.float32)
  fc[:H] = np.eye(H)  # g = the feature entering layer 1 (aux id 0)
  e = np.asarray(target.params["embedding"])
  normed = e / np.sqrt((e ** 2).mean(-1, keepdims=True) + cfg.rms_norm_eps)
  want = np.full((V, DV), -1.0, np.float32)
  for token in range(V):
    if f[f[token]] in ids:
      want[token, np.searchsorted(ids, f[f[token]])] = 4.0
  lm_head = np.linalg.lstsq(normed, want, rcond=None)[0]
  params = {**params, "fc": jnp.asarray(fc), "lm_head": jnp.asarray(lm_head, jnp.float32)}
  return target, jaxspec.FeatureHead(cfg, params, name="tiny-head")


@pytest.mark.parametrize("gamma,schedule", [(1, "constant"), (3, "constant"), (3, "heuristic"), (4, "adaptive")])
def test_greedy_equals_plain(gamma, schedule):
  """Ragged prompts, rows ending by EOS (inside multi-token blocks) and by max_new_tokens at different times;
  under heuristic / adaptive with fallback the batch also rests and probes."""
  target, head = _pair()
  plain = jaxspec.generate(target, PROMPTS, max_new_tokens=16)
  knobs = {} if schedule == "constant" else dict(fallback_alpha=0.5, prior_alpha=0.6, probe_interval=1,
                                                   draft_confidence=0.3)
  chunks = []
  out = jaxspec.generate(target, PROMPTS, jaxspec.Speculation(head, gamma=gamma, schedule=schedule, **knobs),
                         max_new_tokens=16, on_tokens=chunks.append)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  lengths = plain.lengths.tolist()
  assert len(set(lengths)) >= 3 and 16 in lengths and min(lengths) < 16  # rows finish at different times
  stats = out.stats
  assert 0 < stats.accepted.sum() < stats.drafted.sum()
  # A row that ends by EOS had its block cut at an accepted EOS draft when it emitted fewer tokens than the
  # accepted drafts plus one per iteration.
  by_eos = out.lengths < 16
  assert np.any(by_eos & (stats.accepted + stats.iterations > stats.generated))
  assert sum(int(c.counts.sum()) for c in chunks) == int(out.lengths.sum())
  if schedule != "constant":
    assert stats.fallback_iterations.sum() > 0


def test_sampled_runs_and_describes():
  """jaxspec.generate with a head while sampling (exactness: the chi-square tests below) and Speculation's name."""
  target, head = _pair()
  spec = jaxspec.Speculation(head, gamma=3)
  out = jaxspec.generate(target, PROMPTS, spec, jaxspec.Sampling(temperature=0.8, top_k=8), max_new_tokens=12,
                         seed=3)
  assert out.tokens.shape == (len(PROMPTS), 12) and out.stats.drafted.sum() > 0
  assert spec.describe() == "tiny-head gamma=3"


def _run_loop(target, head, schedule, spec=None, max_new_tokens=12):
  """The loop run directly on PROMPTS (greedy): (final state, padded ids, lengths, settings)."""
  cfg = head.config
  layers = eagle3.check_fits(cfg, target.config, head.params)
  settings = loop.LoopSettings(target=target.decoder(), drafter=HeadDrafter(eagle3.Eagle3Head(cfg), layers, V),
                               gamma=3, max_new_tokens=max_new_tokens, greedy=True, filtering=False,
                               eos_ids=(EOS,), pad_id=0, schedule=schedule)
  width = max(map(len, PROMPTS))
  ids = jnp.asarray([p + [0] * (width - len(p)) for p in PROMPTS], jnp.int32)
  lengths = jnp.asarray([len(p) for p in PROMPTS], jnp.int32)
  params = {"head": head.params, "embed": target.params["embedding"]}
  tc, dc, first = jax.jit(loop.prefill, static_argnums=0)(settings, target.params, params, ids, lengths)
  rows = len(PROMPTS)
  state = jax.jit(loop.run, static_argnums=0)(settings, target.params, params, tc, dc, first,
                                              sampling.SamplingKnobs.create(0.0, 0, 1.0),
                                              np.zeros((rows,), np.uint32), np.arange(rows, dtype=np.int32), spec)
  return state, settings, params


@pytest.mark.parametrize("schedule", ["constant", "adaptive"])
def test_head_cache_equals_a_fresh_prefill(schedule):
  """After the loop (rollbacks of rejected drafts; with adaptive, stretches in which the batch rested and the
  head was fed the verified token only), every row's head cache holds, for its positions < L - 1, the keys and
  values a fresh head prefill of prompt + output computes from the target's prefill features, and its `hidden`
  is that prefill's pre-norm output at the last entry."""
  target, head = _pair()
  spec = None
  if schedule == "adaptive":
    spec = schedules.SpeculationKnobs.create(fallback_alpha=0.5, prior_alpha=0.6, probe_interval=1)
  state, settings, params = _run_loop(target, head, schedule, spec)
  if schedule == "adaptive":
    assert int(state.stats.fallback_iterations.sum()) > 0 and int(state.stats.drafted.sum()) > 0
  assert int(state.stats.accepted.sum()) > 0
  cache, hidden = state.draft_state.cache, np.asarray(state.draft_state.hidden)
  seqs, lens = np.asarray(state.sequences), np.asarray(state.lengths)
  np.testing.assert_array_equal(np.asarray(cache.positions), lens - 1)
  decoder, h = target.decoder(), eagle3.Eagle3Head(head.config)
  for b, prompt in enumerate(PROMPTS):
    full = list(prompt) + seqs[b, 1:lens[b]].tolist()  # the loop's token 0 is the prompt's last token
    n = len(full)
    ids, length = jnp.asarray([full], jnp.int32), jnp.asarray([n], jnp.int32)
    features = decoder.prefill(target.params, ids, length, 4, layers=settings.drafter.feature_layers).features
    out = h.prefill(params, eagle3.HeadInput(ids, h.fuse(params["head"], features)), length, 4)
    fresh, prenorm = out.cache, out.features
    assert int(cache.lengths[b]) == int(fresh.lengths[0]) == n - 1
    np.testing.assert_allclose(np.asarray(cache.k[b, :n - 1]), np.asarray(fresh.k[0, :n - 1]), atol=2e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(cache.v[b, :n - 1]), np.asarray(fresh.v[0, :n - 1]), atol=2e-4, rtol=0)
    if n >= 2:
      np.testing.assert_allclose(hidden[b], np.asarray(prenorm[0, n - 2]), atol=2e-4, rtol=0)


def test_save_load_round_trip(tmp_path):
  """jaxspec.save writes the reference's head format; jaxspec.load reads it back as a FeatureHead that decodes
  the same."""
  target, head = _pair()
  jaxspec.save(head, str(tmp_path / "head"))
  loaded = jaxspec.load(str(tmp_path / "head"), dtype=jnp.float32)
  assert isinstance(loaded, jaxspec.FeatureHead) and loaded.config == head.config
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded.params, head.params)
  spec = jaxspec.Speculation(loaded, gamma=2)
  a = jaxspec.generate(target, PROMPTS[:3], spec, max_new_tokens=8)
  b = jaxspec.generate(target, PROMPTS[:3], jaxspec.Speculation(head, gamma=2), max_new_tokens=8)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.stats.accepted, b.stats.accepted)
  with pytest.raises(CheckpointError, match="one device"):
    jaxspec.load(str(tmp_path / "head"), mesh=jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",)))


def test_a_head_for_another_target_is_refused():
  """One CheckpointError naming the mismatch, before anything runs."""
  _, head = _pair()
  other = _target(hidden=48)
  with pytest.raises(CheckpointError, match="does not fit this target.*target_hidden_size.*embedding width 48"):
    jaxspec.generate(other, PROMPTS[:2], jaxspec.Speculation(head, gamma=2), max_new_tokens=4)


# Lossless sampling: a Markov stub target (its features: a table of the token fed) of a 5-token vocabulary, so
# that the joint distribution of whole outputs is enumerated exactly; a random head with a 4-token draft vocabulary
# (q is 0 on the fifth token: the -inf columns of the head's logits).
SV, LENGTH, SEOS, START, ROWS = 5, 3, 4, 0, 4000


def _stub():
  rng = np.random.RandomState(0)
  target = {"table": jnp.asarray(rng.randn(SV, SV) * 2.0, jnp.float32),
            "position_bias": jnp.asarray(rng.randn(16, SV) * 2.0, jnp.float32),
            "features": jnp.asarray(rng.randn(SV, 8), jnp.float32)}
  cfg = eagle3.Eagle3Config(vocab_size=SV, draft_vocab_size=4, hidden_size=8, target_hidden_size=8,
                            intermediate_size=16, num_heads=2, num_kv_heads=1, head_dim=4)
  head = eagle3.init_params(cfg, jax.random.PRNGKey(2), std=0.7)
  draft = {"head": head, "embed": jnp.asarray(rng.randn(SV, 8), jnp.float32)}
  return target, cfg, draft


def _sample(gamma, schedule="constant", spec=None, temperature=1.0, top_k=0):
  target, cfg, draft = _stub()
  decoder = MarkovFeatureDecoder()
  settings = loop.LoopSettings(target=decoder, drafter=HeadDrafter(eagle3.Eagle3Head(cfg), (1, 2, 3), SV),
                               gamma=gamma, max_new_tokens=LENGTH, greedy=False, filtering=top_k > 0,
                               eos_ids=(SEOS,), pad_id=0, schedule=schedule)
  ids = jnp.ones((ROWS, 4), jnp.int32)
  lengths = jnp.full((ROWS,), 4, jnp.int32)
  tc, dc, first = jax.jit(loop.prefill, static_argnums=0)(settings, target, draft, ids, lengths)
  state = jax.jit(loop.run, static_argnums=0)(settings, target, draft, tc, dc, first,
                                              sampling.SamplingKnobs.create(temperature, top_k, 1.0),
                                              np.zeros((ROWS,), np.uint32), np.arange(ROWS, dtype=np.int32), spec)
  seqs, lens = jax.device_get((state.sequences, state.lengths))
  samples = [tuple(s[1:n]) for s, n in zip(seqs, lens)]
  table, pos = np.asarray(target["table"]), np.asarray(target["position_bias"])
  exact = exact_sequence_probs(lambda prefix: np_warp(table[prefix[-1]] + pos[len(prefix) - 1], temperature, top_k),
                               SV, LENGTH, SEOS, START)
  return samples, exact, state


@pytest.mark.parametrize("gamma,schedule,top_k", [(1, "constant", 0), (3, "constant", 0), (3, "constant", 3),
                                                  (3, "adaptive", 0)])
def test_lossless_sampling(gamma, schedule, top_k):
  spec = None
  if schedule != "constant":
    spec = schedules.SpeculationKnobs.create(draft_confidence=0.5, fallback_alpha=0.6, probe_interval=1,
                                            draft_cost=0.1, prior_alpha=0.6)
  samples, exact, state = _sample(gamma, schedule, spec, temperature=0.9 if top_k else 1.0, top_k=top_k)
  stat, dof = chi_square(samples, exact)
  assert stat < chi_square_limit(dof), (stat, dof)
  accepted, drafted = int(state.stats.accepted.sum()), int(state.stats.drafted.sum())
  assert 0 < accepted < drafted
  if schedule != "constant":
    assert int(state.stats.fallback_iterations.sum()) > 0


def test_a_broken_rule_is_caught(monkeypatch):
  """Drawing the correction token from p instead of the residual norm(max(0, p - q)) fails the same test."""
  jax.clear_caches()
  monkeypatch.setattr(verify, "residual_probs", lambda p, q: p)
  try:
    samples, exact, _ = _sample(3)
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  stat, dof = chi_square(samples, exact)
  assert stat > 3 * chi_square_limit(dof), (stat, dof)
