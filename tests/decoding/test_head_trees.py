"""Token trees drafted by an EAGLE-3 feature head (`HeadDrafter.propose_tree`; docs/trees.md, "Trees from a
feature head"): greedy output identical to plain decoding (two decoder-only families and T5), a one-child tree
equal to the head's chain token for token, the head's cache after a tree decode equal to a fresh prefill, and
lossless sampling (chi-square against exact enumeration, with a negative control that must fail).

The decoder-only targets are built as in test_head_drafter.py: layers that write little into the residual stream
(the next token is mostly a map f of the current one) and a head whose `lm_head` is solved so that its argmax is
f(f(token p)), the target's token p + 2. Its first draft is then often right and later ones rarely: trees see
accepted and rejected branches, and EOS (a token whose first occurrence varies between rows) is accepted inside a
branch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.device import loop, sampling, tree_verify
from jaxspec.decoding.drafters.head_drafter import HeadDrafter
from jaxspec.models import decoder_only as do
from jaxspec.models import eagle3
from jaxspec.models.decoder_only.llama import LlamaConfig
from jaxspec.models.decoder_only.qwen import QwenConfig

from conftest import write_hf_t5
from stub_models import MarkovFeatureDecoder, chi_square, chi_square_limit, exact_sequence_probs, np_warp

V, H, DV = 16, 32, 12  # target vocabulary, hidden size, the head's draft vocabulary
EOS = 4  # the EOS of the first plain decode (`_with_ragged_eos` picks the one the tests use)
PROMPTS = [[3, 5, 7, 9, 11], [4, 6], [8, 1, 12], [2], [14, 13, 12, 11, 10, 3, 7], [6, 6, 6]]
MAX_NEW = 13  # not a multiple of any depth + 1 tested: max_new_tokens ends rows inside a branch


def _config(family: str):
  small = dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
               head_dim=8, eos_ids=(EOS,), pad_token_id=0, bos_token_id=None)
  if family == "llama":
    return LlamaConfig(**small)
  if family == "mistral":  # a sliding window: tree nodes see the prefix through their own window
    return LlamaConfig(**small, sliding_window=4)
  return QwenConfig(**small, model_type="qwen3", qk_norm=True)


@functools.lru_cache(maxsize=None)
def _pair(family: str) -> tuple[jaxspec.Model, jaxspec.FeatureHead]:
  """A target whose layers mix little and a head that knows its next-token map f (the module docstring)."""
  cfg = _config(family)
  p = jax.jit(do.init_params, static_argnums=0, static_argnames="std")(cfg, jax.random.PRNGKey(0), std=1.0)
  p["layers"] = [dict(l, attention=dict(l["attention"], o=l["attention"]["o"] * 0.05 / 4),
                      mlp=dict(l["mlp"], down=l["mlp"]["down"] * 0.05 / 8)) for l in p["layers"]]
  target = jaxspec.Model(cfg, p, name=f"tiny-{family}")
  # f: the greedy next token after each token alone, from one forward pass (no decoding program to compile).
  f = np.asarray(jnp.argmax(jax.jit(do.forward, static_argnums=1)(p, cfg, jnp.arange(V)[:, None])[:, -1], -1))
  hcfg = eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=DV, hidden_size=H, target_hidden_size=H,
                             intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 1, 2))
  params = eagle3.init_params(hcfg, jax.random.PRNGKey(1), std=0.02)
  ids = np.flatnonzero(np.asarray(params["t2d"]))
  fc = np.zeros((3 * H, H), np.float32)
  fc[:H] = np.eye(H)  # g = the feature entering layer 1 (aux id 0)
  e = np.asarray(target.params["embedding"])
  normed = e / np.sqrt((e ** 2).mean(-1, keepdims=True) + hcfg.rms_norm_eps)
  want = np.full((V, DV), -1.0, np.float32)
  for token in range(V):
    if f[f[token]] in ids:
      want[token, np.searchsorted(ids, f[f[token]])] = 4.0
  lm_head = np.linalg.lstsq(normed, want, rcond=None)[0]
  params = {**params, "fc": jnp.asarray(fc), "lm_head": jnp.asarray(lm_head, jnp.float32)}
  return _with_ragged_eos(target), jaxspec.FeatureHead(hcfg, params, name="tiny-head")


def _with_ragged_eos(target: jaxspec.Model) -> jaxspec.Model:
  """The target with, as its EOS, the token whose first occurrence in the plain outputs varies most between rows
  (never at the start), so that rows end at different times."""
  out = jaxspec.generate(target, PROMPTS, max_new_tokens=MAX_NEW)
  rows = [r[:n].tolist() for r, n in zip(out.tokens, out.lengths)]
  best, spread = EOS, -1
  for token in sorted({t for r in rows for t in r}):
    first = [r.index(token) if token in r else MAX_NEW for r in rows]
    if min(first) >= 1 and len(set(first)) > spread:
      best, spread = token, len(set(first))
  return dataclasses.replace(target, config=dataclasses.replace(target.config, eos_ids=(best,)))


@pytest.mark.parametrize("family,gamma,top_k,nodes,capped", [("qwen3", 4, 2, 6, False), ("mistral", 3, 3, 7, True)])
def test_greedy_head_trees_equal_plain(family, gamma, top_k, nodes, capped):
  """Ragged prompts; rows end by EOS accepted inside a branch and (`capped`: where the head's acceptance on the
  rows that reach it allows) by max_new_tokens inside a branch, at different times; the tree accepts more per
  target call than the head's chain of the same depth."""
  target, head = _pair(family)
  plain = jaxspec.generate(target, PROMPTS, max_new_tokens=MAX_NEW)
  lengths = plain.lengths.tolist()
  assert len(set(lengths)) >= 3 and MAX_NEW in lengths and min(lengths) < MAX_NEW
  spec = jaxspec.Speculation(head, gamma=gamma, tree=jaxspec.Tree(top_k=top_k, nodes=nodes))
  chunks = []
  out = jaxspec.generate(target, PROMPTS, spec, max_new_tokens=MAX_NEW, on_tokens=chunks.append)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  assert sum(int(c.counts.sum()) for c in chunks) == int(out.lengths.sum())
  stats = out.stats
  assert stats.accepted.sum() > 0 and stats.acceptance_per_position.shape == (gamma,)
  # A row whose path was cut (at an accepted EOS draft, or at max_new_tokens) emitted fewer tokens than its
  # accepted drafts plus one per iteration.
  cut = stats.accepted + stats.iterations > stats.generated
  by_eos = np.isin(out.tokens[np.arange(len(PROMPTS)), out.lengths - 1], target.config.eos_ids)
  assert np.any(cut & by_eos)
  if capped:
    assert np.any(cut & ~by_eos & (out.lengths == MAX_NEW))
  chain = jaxspec.generate(target, PROMPTS, jaxspec.Speculation(head, gamma=gamma), max_new_tokens=MAX_NEW)
  assert stats.accepted.sum() > chain.stats.accepted.sum()


def _settings(target, head, gamma, tree, max_new_tokens=MAX_NEW):
  layers = eagle3.check_fits(head.config, target.config, head.params)
  drafter = HeadDrafter(eagle3.Eagle3Head(head.config), layers, target.config.vocab_size)
  return loop.LoopSettings(target=target.decoder(), drafter=drafter, gamma=gamma, max_new_tokens=max_new_tokens,
                           greedy=True, filtering=False, eos_ids=tuple(target.config.eos_ids), pad_id=0, tree=tree)


def _loop_state(settings, target, head, prompts=PROMPTS):
  """The loop's final state (greedy), run directly with these static settings (the engine would run a one-child
  tree as the chain loop)."""
  width = max(map(len, prompts))
  ids = jnp.asarray([p + [0] * (width - len(p)) for p in prompts], jnp.int32)
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
  params = {"head": head.params, "embed": target.params["embedding"]}
  tc, dc, first = jax.jit(functools.partial(loop.prefill, settings))(target.params, params, ids, lengths)
  rows = len(prompts)
  state = jax.jit(functools.partial(loop.run, settings))(
      target.params, params, tc, dc, first, sampling.SamplingKnobs.create(0.0, 0, 1.0),
      np.zeros((rows,), np.uint32), np.arange(rows, dtype=np.int32))
  return state, params


def test_a_one_child_head_tree_is_the_head_chain():
  """Through the tree machinery (the head's beams, step_tree_features, tree verification, the path's features to
  settle), top_k = 1 emits the head chain's tokens and accepts as many drafts, row by row."""
  target, head = _pair("llama")
  chain, _ = _loop_state(_settings(target, head, 3, None), target, head)
  tree, _ = _loop_state(_settings(target, head, 3, jaxspec.Tree(top_k=1, nodes=3)), target, head)
  for got, want in [(tree.sequences, chain.sequences), (tree.lengths, chain.lengths),
                    (tree.stats.accepted, chain.stats.accepted), (tree.stats.iterations, chain.stats.iterations)]:
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert int(chain.stats.accepted.sum()) > 0
  np.testing.assert_allclose(np.asarray(tree.draft_state.hidden), np.asarray(chain.draft_state.hidden), atol=1e-5)


def test_head_cache_after_a_tree_decode_equals_a_fresh_prefill():
  """After a whole tree decode (accepted paths of several nodes, rejected siblings, the tree's own entries), every
  row's head cache holds, for its positions < L - 1, what a fresh head prefill of prompt + output computes from
  the target's prefill features, and its `hidden` is that prefill's pre-norm output at the last entry: no tree
  entry survived, and the path was re-fed from the target's real features in path order."""
  target, head = _pair("llama")
  settings = _settings(target, head, 3, jaxspec.Tree(top_k=3, nodes=8), max_new_tokens=12)
  state, params = _loop_state(settings, target, head)
  assert int(state.stats.accepted.sum()) > 0 and int(state.stats.accepted_per_position[:, 1].sum()) > 0
  cache, hidden = state.draft_state.cache, np.asarray(state.draft_state.hidden)
  seqs, lens = np.asarray(state.sequences), np.asarray(state.lengths)
  np.testing.assert_array_equal(np.asarray(cache.positions), lens - 1)
  decoder, h = target.decoder(), eagle3.Eagle3Head(head.config)

  @jax.jit
  def fresh_prefill(target_params, params, ids, lengths):
    """The target's prefill features, then the head's prefill, of every row at once (right padding never
    affects a row's real positions, nor the head's entries < len - 1)."""
    features = decoder.prefill(target_params, ids, lengths, 4, layers=settings.drafter.feature_layers).features
    out = h.prefill(params, eagle3.HeadInput(ids, h.fuse(params["head"], features)), lengths, 4)
    return out.cache, out.features

  # The loop's token 0 is the prompt's last token.
  full = [list(prompt) + seqs[b, 1:lens[b]].tolist() for b, prompt in enumerate(PROMPTS)]
  width = max(map(len, full))
  fresh, prenorm = fresh_prefill(target.params, params,
                                 jnp.asarray([f + [0] * (width - len(f)) for f in full], jnp.int32),
                                 jnp.asarray([len(f) for f in full], jnp.int32))
  prenorm = np.asarray(prenorm)
  for b, n in enumerate(map(len, full)):
    assert int(cache.lengths[b]) == int(fresh.lengths[b]) == n - 1
    np.testing.assert_allclose(np.asarray(cache.k[b, :n - 1]), np.asarray(fresh.k[b, :n - 1]), atol=2e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(cache.v[b, :n - 1]), np.asarray(fresh.v[b, :n - 1]), atol=2e-4, rtol=0)
    if n >= 2:
      np.testing.assert_allclose(hidden[b], prenorm[b, n - 2], atol=2e-4, rtol=0)


def test_greedy_head_trees_on_t5_equal_plain(tmp_path):
  """A T5 target (the head starts with an empty cache: the decoder has no prompt features) and a random head,
  over a vocabulary of 8 so that its trees (4 of the 8 tokens per expanded node) are accepted by chance: identical
  to plain greedy decoding, with EOS ending rows at different times and paths of three drafts accepted."""
  target = jaxspec.load(write_hf_t5(str(tmp_path / "t5"), "t5_v1_1", vocab_size=8, d_model=32, num_layers=2,
                                    num_decoder_layers=3, num_heads=4, d_ff=64), dtype=jnp.float32)
  cfg = eagle3.Eagle3Config(vocab_size=8, draft_vocab_size=8, hidden_size=32, target_hidden_size=32,
                            intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 1, 2))
  head = jaxspec.FeatureHead(cfg, eagle3.init_params(cfg, jax.random.PRNGKey(3), std=0.3), name="random-head")
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(2, 8, size=n)) + [1] for n in (4, 11, 1, 7)]
  eos = int(jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW).tokens[0, 7])  # first emitted at step 7
  target = dataclasses.replace(target, config=dataclasses.replace(target.config, eos_token_id=eos))
  plain = jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW)
  assert len(set(plain.lengths.tolist())) >= 3 and plain.lengths.max() == MAX_NEW
  out = jaxspec.generate(target, prompts, jaxspec.Speculation(head, gamma=3, tree=jaxspec.Tree(top_k=4, nodes=20)),
                         max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  assert int(out.stats.accepted_per_position[:, 2].sum()) > 0  # paths of three drafts


# Lossless sampling: the Markov stub target of test_head_drafter.py (its features: a table of the token fed) over
# a 5-token vocabulary, so that the joint distribution of whole outputs is enumerated exactly; a random head with
# a 4-token draft vocabulary (the fifth token never enters a tree). ROWS: the limit (z = 4.5) keeps a correct
# rule's false-failure probability at ~3e-6 whatever the count; the count sets the power. The negative control's
# statistic with 2000 rows is 351 against a limit of 45 (dof 10; noncentrality ~ 341, sd ~ sqrt(2 (dof + 2 x 341))
# ~ 37: 8 sd of margin); with 4000 rows it was 751 against 52, with 1000, 173 against 41.
SV, LENGTH, SEOS, START, ROWS = 5, 3, 4, 0, 2000


def _sample(tree, temperature=1.0, top_k=0):
  rng = np.random.RandomState(0)
  target = {"table": jnp.asarray(rng.randn(SV, SV) * 2.0, jnp.float32),
            "position_bias": jnp.asarray(rng.randn(16, SV) * 2.0, jnp.float32),
            "features": jnp.asarray(rng.randn(SV, 8), jnp.float32)}
  cfg = eagle3.Eagle3Config(vocab_size=SV, draft_vocab_size=4, hidden_size=8, target_hidden_size=8,
                            intermediate_size=16, num_heads=2, num_kv_heads=1, head_dim=4)
  draft = {"head": eagle3.init_params(cfg, jax.random.PRNGKey(2), std=0.7),
           "embed": jnp.asarray(rng.randn(SV, 8), jnp.float32)}
  settings = loop.LoopSettings(target=MarkovFeatureDecoder(),
                               drafter=HeadDrafter(eagle3.Eagle3Head(cfg), (1, 2, 3), SV), gamma=2,
                               max_new_tokens=LENGTH, greedy=False, filtering=top_k > 0, eos_ids=(SEOS,), pad_id=0,
                               tree=tree)
  ids, lengths = jnp.ones((ROWS, 4), jnp.int32), jnp.full((ROWS,), 4, jnp.int32)
  tc, dc, first = jax.jit(functools.partial(loop.prefill, settings))(target, draft, ids, lengths)
  state = jax.jit(functools.partial(loop.run, settings))(
      target, draft, tc, dc, first, sampling.SamplingKnobs.create(temperature, top_k, 1.0),
      np.zeros((ROWS,), np.uint32), np.arange(ROWS, dtype=np.int32))
  seqs, lens = jax.device_get((state.sequences, state.lengths))
  samples = [tuple(s[1:n]) for s, n in zip(seqs, lens)]
  table, pos = np.asarray(target["table"]), np.asarray(target["position_bias"])
  exact = exact_sequence_probs(lambda prefix: np_warp(table[prefix[-1]] + pos[len(prefix) - 1], temperature, top_k),
                               SV, LENGTH, SEOS, START)
  return samples, exact, state


@pytest.mark.parametrize("tree,temperature,top_k", [(jaxspec.Tree(top_k=2, nodes=4), 1.0, 0),
                                                    (jaxspec.Tree(top_k=3, nodes=6), 0.9, 3)])
def test_lossless_sampling_with_head_trees(tree, temperature, top_k):
  """Depth 2: the joint distribution of 3 tokens spans two iterations (the second drafted from the head's cache
  after a tree settle)."""
  samples, exact, state = _sample(tree, temperature, top_k)
  stat, dof = chi_square(samples, exact)
  assert stat < chi_square_limit(dof), (stat, dof)
  assert 0 < int(state.stats.accepted.sum()) < int(state.stats.drafted.sum())


def test_a_broken_head_tree_rule_is_caught(monkeypatch):
  """Negative control: recursive rejection sampling whose residual after a rejected draw is r itself (q not
  subtracted) fails the same test (the head's children are draws from its q)."""
  jax.clear_caches()
  monkeypatch.setattr(tree_verify, "residual_probs", lambda r, q: r)
  try:
    samples, exact, _ = _sample(jaxspec.Tree(top_k=2, nodes=4))
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  stat, dof = chi_square(samples, exact)
  assert stat > chi_square_limit(dof), (stat, dof)
