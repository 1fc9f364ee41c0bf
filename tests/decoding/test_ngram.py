"""Prompt-lookup drafting (jaxspec.NGramDraft): the vectorised search against a plain Python one, greedy exactness
on a T5 pair (sampling is in test_sampling_lossless.py), and argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.drafters import ngram
from jaxspec.models import t5



@pytest.fixture
def strict_ranks():
  """Rank promotion raises inside the test (the decoding code's own functions; the T5 model's are not strict)."""
  with jax.numpy_rank_promotion("raise"):
    yield


def _reference(context: list, gamma: int, max_n: int, min_n: int) -> list:
  """The continuation of the earliest earlier occurrence of the longest suffix (n = max_n .. min_n), in Python."""
  for n in range(max_n, min_n - 1, -1):
    if len(context) <= n:
      continue
    suffix = context[-n:]
    for i in range(len(context) - n):
      if context[i:i + n] == suffix:
        return context[i + n:i + n + gamma]
  return []


@pytest.mark.usefixtures("strict_ranks")
@pytest.mark.parametrize("max_n,min_n", [(3, 1), (2, 2), (4, 2)])
def test_search_matches_a_python_reference(max_n, min_n):
  rng = np.random.RandomState(max_n * 10 + min_n)
  batch, width, gamma = 64, 24, 4
  lengths = rng.randint(1, width - gamma, size=batch)
  tokens = rng.randint(0, 4, size=(batch, width))  # a small vocabulary: many repeats
  tokens[np.arange(width)[None] >= lengths[:, None]] = 7  # junk past each row's end must never match
  context = ngram.NGramContext(tokens=jnp.asarray(tokens, jnp.int32), lengths=jnp.asarray(lengths, jnp.int32))
  got, counts = jax.jit(ngram.propose, static_argnums=(0, 2))(jaxspec.NGramDraft(max_n, min_n), context, gamma)
  got, counts = np.asarray(got), np.asarray(counts)
  found = 0
  for b in range(batch):
    want = _reference(tokens[b, :lengths[b]].tolist(), gamma, max_n, min_n)
    assert counts[b] == len(want), b
    assert got[b, :counts[b]].tolist() == want, b
    found += bool(want)
  assert 0 < found < batch  # both cases occur


@pytest.mark.usefixtures("strict_ranks")
def test_append_extends_each_row():
  context = ngram.init_context(jnp.asarray([[5, 6, 0, 0], [7, 8, 9, 1]], jnp.int32), jnp.asarray([2, 4]), 6)
  context = ngram.append(context, jnp.asarray([[1, 2, 0], [3, 0, 0]], jnp.int32), jnp.asarray([2, 1]))
  assert context.lengths.tolist() == [4, 5]
  assert np.asarray(context.tokens)[0, :4].tolist() == [5, 6, 1, 2]
  assert np.asarray(context.tokens)[1, :5].tolist() == [7, 8, 9, 1, 3]


def test_bad_settings_are_clear_errors():
  with pytest.raises(ValueError, match="min_ngram must be an integer >= 1"):
    jaxspec.NGramDraft(max_ngram=3, min_ngram=0)
  with pytest.raises(ValueError, match="max_ngram must be an integer >= min_ngram=2"):
    jaxspec.NGramDraft(max_ngram=1, min_ngram=2)
  with pytest.raises(ValueError, match="max_ngram"):
    jaxspec.NGramDraft(max_ngram=2.5)


@pytest.fixture(scope="module")
def target():
  cfg = t5.T5Config(vocab_size=24, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=2, num_heads=2,
                    eos_token_id=1)
  return jaxspec.Model(cfg, t5.init_params(cfg, jax.random.key(4)), name="tiny")


def _prompts(seed=0):
  rng = np.random.RandomState(seed)
  rows = []
  for n in (12, 5, 20, 9):
    base = list(rng.randint(2, 24, size=4))
    rows.append((base * 6)[:n] + [1])  # repeated phrases: the lookup finds matches in the input
  return rows


@pytest.mark.parametrize("schedule", ["constant", "adaptive"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_ngram_equals_plain(target, schedule, gamma):
  prompts = _prompts()
  plain = jaxspec.generate(target, prompts, max_new_tokens=20)
  out = jaxspec.generate(target, prompts, jaxspec.Speculation(jaxspec.NGramDraft(max_ngram=3), gamma=gamma, schedule=schedule), max_new_tokens=20)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  s = out.stats
  assert s.accepted.sum() > 0  # proposals were used
  assert s.draft_lengths[:, 0].sum() > 0 and s.draft_lengths[:, 1:].sum() > 0  # rows with and without a match
  assert np.all(s.draft_lengths.sum(1) == s.iterations)
  assert np.all(s.drafted == (s.draft_lengths * np.arange(gamma + 1)).sum(1))


def _reference_tree(context: list, gamma: int, max_n: int, min_n: int, top_k: int) -> set:
  """The root-to-node paths (token tuples) of the lookup tree, in Python: the continuations of the top_k first
  distinct match positions (longest n first, then earliest), each path a prefix of one continuation."""
  starts = []
  for n in range(max_n, min_n - 1, -1):
    if len(context) <= n:
      continue
    for i in range(len(context) - n):
      if context[i:i + n] == context[-n:] and i + n not in starts and len(starts) < top_k:
        starts.append(i + n)
  return {tuple(context[s:s + d]) for s in starts for d in range(1, gamma + 1) if s + d <= len(context)}


@pytest.mark.usefixtures("strict_ranks")
def test_lookup_trees_match_a_python_reference():
  """Every used node's path is a prefix of one of the top_k continuations, each such prefix appears exactly once
  (common prefixes merged), parents come before children, and unused nodes are never reached."""
  rng = np.random.RandomState(3)
  batch, width, gamma, top_k = 48, 24, 3, 3
  lengths = rng.randint(2, width - 2 * gamma, size=batch)
  tokens = rng.randint(0, 4, size=(batch, width))
  tokens[np.arange(width)[None] >= lengths[:, None]] = 7
  context = ngram.NGramContext(tokens=jnp.asarray(tokens, jnp.int32), lengths=jnp.asarray(lengths, jnp.int32))
  root = jnp.asarray(tokens[np.arange(batch), lengths - 1], jnp.int32)
  got = jax.jit(ngram.propose_tree, static_argnums=(0, 3, 4, 5))(jaxspec.NGramDraft(2, 1), context, root, gamma,
                                                                  top_k, 64)
  tokens_t, parents, depths, _ = (np.asarray(x) for x in got)
  assert tokens_t.shape == (batch, 1 + top_k * gamma)
  branching = 0
  for b in range(batch):
    paths = []
    for node in range(1, tokens_t.shape[1]):
      if parents[b, node] < 0:
        continue
      assert parents[b, node] < node
      path, at = [], node
      while at > 0:
        path.append(int(tokens_t[b, at]))
        at = parents[b, at]
      paths.append(tuple(reversed(path)))
      assert len(path) == depths[b, node]
    want = _reference_tree(tokens[b, :lengths[b]].tolist(), gamma, 2, 1, top_k)
    assert sorted(paths) == sorted(want), b  # each prefix once
    branching += sum(1 for n in range(1, tokens_t.shape[1]) if parents[b, n] == 0) > 1
  assert branching > 0  # some rows have several first tokens
