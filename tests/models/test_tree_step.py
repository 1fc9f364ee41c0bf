"""Token trees in the Decoder contract (docs/trees.md): `step(..., tree=...)` and `cache.compact` for every family.

Each family's tiny random model is checked against its own plain `step`:
(a) a chain tree (depths 0..N-1, lower-triangular ancestors) gives step's logits and cache;
(b) each node of a branching tree gives the logits of step fed that node's root-to-node path;
(c) after `compact` on a path, the cache equals (below the new lengths) the cache of step fed the path, and a
    following step gives the same logits;
(d) rows differ in cached length and in tree shape throughout (the prefix is ragged per row).
Sliding windows (Mistral 5, Gemma 4) are smaller than the sequences, so they cut into the prefix.
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from decoder_only_models import VARIANTS  # noqa: E402

from jaxspec.models import contract, t5  # noqa: E402
from jaxspec.models import decoder_only as do  # noqa: E402
from jaxspec.models.decoder_only import gemma, llama, qwen  # noqa: E402

# variant -> (model_type, family module)
DECODER_ONLY = {"llama2": ("llama", llama), "llama3": ("llama", llama), "mistral": ("mistral", llama),
                "qwen2": ("qwen2", qwen), "qwen3": ("qwen3", qwen), "gemma2": ("gemma2", gemma),
                "gemma3": ("gemma3_text", gemma)}
T5 = {"t5_v1_0": dict(), "t5_v1_1": dict(activation="gelu_new", gated=True, tie_word_embeddings=False,
                                          scale_decoder_outputs=False)}
FAMILIES = list(DECODER_ONLY) + list(T5)

# Two rows with different trees (parents before children, node 0 the root). Row 0: two branches under the
# root, two under node 1, depth 4. Row 1: three under the root, the last one (node 3, slot 3) grows a chain to
# depth 6: its deep nodes' windows (4, 5 positions) end above node 3's position but not above its slot, so a
# window computed from slots instead of positions would show.
PARENTS = np.array([[-1, 0, 0, 1, 1, 2, 3, 6, 4],
                    [-1, 0, 0, 0, 3, 4, 5, 6, 7]], np.int32)
PROMPT_LENGTHS = (6, 10)  # decoder-only prompts (ragged); T5 encoder inputs are padded the same way
HISTORY, KEEP = 5, (2, 5)  # a plain step of 5 tokens, then rolled back to 2 and 5 of them per row
CACHE_LEN = 24


def tree_arrays(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(depths [B, N] int32, ancestors [B, N, N] bool) of parent arrays [B, N] (-1 at the root)."""
  b, n = parents.shape
  depths = np.zeros((b, n), np.int32)
  ancestors = np.zeros((b, n, n), bool)
  for r in range(b):
    for i in range(n):
      j = i
      while j >= 0:
        ancestors[r, i, j] = True
        j = parents[r, j]
      depths[r, i] = ancestors[r, i].sum() - 1
  return depths, ancestors


def path_to(parents: np.ndarray, node: int) -> list[int]:
  """Node indices from the root to `node` (one row's parents)."""
  path = [node]
  while parents[path[-1]] >= 0:
    path.append(int(parents[path[-1]]))
  return path[::-1]


@functools.lru_cache(maxsize=None)
def setup(family: str):
  """(decoder, params, cache with ragged lengths) of a tiny random model of `family`; jitted calls."""
  key = jax.random.key(FAMILIES.index(family))
  rng = np.random.RandomState(0)
  if family in DECODER_ONLY:
    model_type, module = DECODER_ONLY[family]
    cfg = module.FAMILY.config_class.from_hf_dict(dict(VARIANTS[family][1], model_type=model_type, eos_token_id=2))
    decoder = do.CausalDecoder(cfg)
    params = do.init_params(cfg, key, std=0.3)
  else:
    cfg = t5.T5Config(vocab_size=96, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
                      relative_attention_num_buckets=8, relative_attention_max_distance=20, **T5[family])
    decoder = t5.T5Decoder(cfg)
    params = t5.init_params(cfg, key)
  vocab = cfg.vocab_size
  inputs = np.zeros((2, max(PROMPT_LENGTHS)), np.int32)
  for r, n in enumerate(PROMPT_LENGTHS):
    inputs[r, :n] = rng.randint(3, vocab, size=n)
  out = decoder.prefill(params, jnp.asarray(inputs), jnp.asarray(PROMPT_LENGTHS, jnp.int32), CACHE_LEN)
  cache, first = out.cache, out.first
  history = jnp.concatenate([first[:, None], jnp.asarray(rng.randint(3, vocab, size=(2, HISTORY - 1)))], axis=1)
  _, cache = step(decoder)(params, cache, history.astype(jnp.int32))
  cache = cache.rollback(jnp.asarray(KEEP, jnp.int32))
  return decoder, params, cache, vocab


def _pair(res):
  return res.logits, res.cache


@functools.lru_cache(maxsize=None)
def step(decoder):
  """(params, cache, tokens) -> (logits, cache): a chain's `Decoder.step`, jitted."""
  jitted = jax.jit(decoder.step)
  return lambda params, cache, tokens: _pair(jitted(params, cache, tokens))


@functools.lru_cache(maxsize=None)
def step_tree(decoder):
  """(params, cache, tokens, depths, ancestors) -> (logits, cache): `Decoder.step` over tree nodes, jitted."""
  jitted = jax.jit(lambda p, c, t, d, a: decoder.step(p, c, t, tree=contract.TreeNodes(d, a)))
  return lambda *args: _pair(jitted(*args))


compact = jax.jit(lambda cache, base, path, path_len: cache.compact(base, path, path_len))


def assert_same_cache(got, want, lengths: np.ndarray) -> None:
  """Every per-position array equal at positions < lengths of each row; lengths equal."""
  np.testing.assert_array_equal(got.lengths, want.lengths)
  for name, axis in type(got).position_fields.items():
    for g, w in zip(getattr(got, name), getattr(want, name)):
      g, w = np.moveaxis(np.asarray(g), axis, 1), np.moveaxis(np.asarray(w), axis, 1)
      for r, n in enumerate(lengths):
        np.testing.assert_allclose(g[r, :n], w[r, :n], rtol=1e-5, atol=1e-5, err_msg=f"{name} row {r}")


def test_ragged_setup():
  """(d) the rows' cached lengths differ (and the windows, 4 and 5, are shorter than them)."""
  for family, shortest in (("mistral", 5), ("gemma2", 4), ("t5_v1_0", 1)):
    lengths = np.asarray(setup(family)[2].lengths)
    assert lengths[0] != lengths[1] and lengths.min() > shortest, lengths


@pytest.mark.parametrize("family", FAMILIES)
def test_chain_tree_is_step(family):
  """(a) depths 0..N-1 and lower-triangular ancestors: step's logits and cache."""
  decoder, params, cache, vocab = setup(family)
  n = 5
  tokens = jnp.asarray(np.random.RandomState(1).randint(3, vocab, size=(2, n)), jnp.int32)
  depths = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (2, n))
  ancestors = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (2, n, n))
  want, want_cache = step(decoder)(params, cache, tokens)
  got, got_cache = step_tree(decoder)(params, cache, tokens, depths, ancestors)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert_same_cache(got_cache, want_cache, np.asarray(want_cache.lengths))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_node_sees_its_path(family):
  """(b) node n's logits are those of step fed n's root-to-node path, for every node of a branching tree, each
  row its own tree and prefix length."""
  decoder, params, cache, vocab = setup(family)
  depths, ancestors = tree_arrays(PARENTS)
  tokens = np.random.RandomState(2).randint(3, vocab, size=PARENTS.shape).astype(np.int32)
  got, tree_cache = step_tree(decoder)(params, cache, jnp.asarray(tokens), jnp.asarray(depths),
                                       jnp.asarray(ancestors))
  np.testing.assert_array_equal(tree_cache.lengths, cache.lengths + PARENTS.shape[1])
  width = int(depths.max()) + 1
  for node in range(PARENTS.shape[1]):
    paths = np.zeros((2, width), np.int32)  # each row's path to `node`, padded after its end (causal: unseen)
    for r in range(2):
      path = path_to(PARENTS[r], node)
      paths[r, :len(path)] = tokens[r, path]
    want, _ = step(decoder)(params, cache, jnp.asarray(paths))
    for r in range(2):
      np.testing.assert_allclose(got[r, node], want[r, depths[r, node]], rtol=1e-5, atol=1e-5,
                                 err_msg=f"node {node} row {r}")


@pytest.mark.parametrize("family", FAMILIES)
def test_compact_keeps_the_path(family):
  """(c) compact on a path (rows of different path lengths): the cache of step fed that path, and the same
  logits from the next step."""
  decoder, params, cache, vocab = setup(family)
  depths, ancestors = tree_arrays(PARENTS)
  tokens = np.random.RandomState(3).randint(3, vocab, size=PARENTS.shape).astype(np.int32)
  _, tree_cache = step_tree(decoder)(params, cache, jnp.asarray(tokens), jnp.asarray(depths), jnp.asarray(ancestors))
  ends = (7, 3)  # row 0 keeps 0-1-3-6-7, row 1 keeps 0-3
  path = np.zeros((2, 5), np.int32)
  path_len = np.zeros((2,), np.int32)
  kept = np.zeros((2, 5), np.int32)
  for r, end in enumerate(ends):
    p = path_to(PARENTS[r], end)
    path[r, :len(p)], path_len[r] = p, len(p)
    kept[r, :len(p)] = tokens[r, p]
  base = cache.lengths
  got = compact(tree_cache, base, jnp.asarray(path), jnp.asarray(path_len))
  _, want = step(decoder)(params, cache, jnp.asarray(kept))
  want = want.rollback(want.positions - 5 + jnp.asarray(path_len))
  assert_same_cache(got, want, np.asarray(want.lengths))
  following = jnp.asarray(np.random.RandomState(4).randint(3, vocab, size=(2, 2)), jnp.int32)
  np.testing.assert_allclose(step(decoder)(params, got, following)[0], step(decoder)(params, want, following)[0],
                             rtol=1e-5, atol=1e-5)


def test_tree_attention_mask():
  """The mask and positions on a hand-made case: prefix of 2 and 3, root with two children, C = 6."""
  depths = jnp.asarray([[0, 1, 1], [0, 1, 2]], jnp.int32)
  ancestors = jnp.asarray([[[1, 0, 0], [1, 1, 0], [1, 0, 1]], [[1, 0, 0], [1, 1, 0], [1, 1, 1]]], bool)
  with jax.numpy_rank_promotion("raise"):
    query_pos, key_pos, allowed = contract.tree_attention(jnp.asarray([2, 3], jnp.int32), depths, ancestors, 6)
  np.testing.assert_array_equal(query_pos, [[2, 3, 3], [3, 4, 5]])
  np.testing.assert_array_equal(key_pos, [[0, 1, 2, 3, 3, 5], [0, 1, 2, 3, 4, 5]])
  np.testing.assert_array_equal(allowed[0], [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0]])
  np.testing.assert_array_equal(allowed[1], [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])


def test_compact_rows():
  """compact_rows on a hand-made buffer: per-row gathers written at per-row bases, the rest untouched."""
  buffer = jnp.arange(2 * 8, dtype=jnp.float32).reshape(2, 8, 1)
  with jax.numpy_rank_promotion("raise"):
    out = contract.compact_rows(buffer, jnp.asarray([1, 3], jnp.int32), jnp.asarray([[0, 2, 3], [0, 1, 0]]), 1)
  np.testing.assert_array_equal(out[0, :, 0], [0, 1, 3, 4, 4, 5, 6, 7])
  np.testing.assert_array_equal(out[1, :, 0], [8, 9, 10, 11, 12, 11, 14, 15])  # slot 5 past the kept length



@pytest.mark.parametrize("family", ["llama2", "gemma2", "t5_v1_1"])
def test_greedy_tree_rounds_are_greedy_decoding(family):
  """step_tree, tree_verify.accept_tree_greedy and compact, round after round (a tree per round with the
  target's greedy token hidden among siblings, at random depths), emit the target's greedy decode."""
  from jaxspec.decoding.device import tree_verify
  decoder, params, cache, vocab = setup(family)
  rng = np.random.RandomState(5)
  greedy, c, token = [], cache, jnp.asarray([3, 4], jnp.int32)  # a first token per row
  for _ in range(12):  # plain greedy decoding, one token at a time
    logits, c = step(decoder)(params, c, token[:, None])
    token = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
    greedy.append(np.asarray(token))
  greedy = np.stack(greedy, axis=1)  # [B, 12]
  parents = np.array([-1, 0, 0, 1, 1, 3, 3], np.int32)
  depths, ancestors = tree_arrays(np.stack([parents, parents]))
  verify = jax.jit(lambda tokens, logits: tree_verify.accept_tree_greedy(
      tokens, jnp.asarray(np.stack([parents, parents])), logits, path_size=4))
  emitted, accepted = [[], []], 0
  root = np.asarray([3, 4], np.int32)
  while min(len(e) for e in emitted) < 8:
    tokens = rng.randint(3, vocab, size=(2, 7)).astype(np.int32)
    tokens[:, 0] = root
    for r in range(2):  # the next greedy tokens on a random branch: node 1 or 2, then 3 or 4, then 5 or 6
      done = len(emitted[r])
      tokens[r, rng.choice([1, 2])] = greedy[r, done]
      tokens[r, rng.choice([3, 4])] = greedy[r, done + 1]
      tokens[r, rng.choice([5, 6])] = greedy[r, done + 2]
    base = cache.lengths
    logits, cache = step_tree(decoder)(params, cache, jnp.asarray(tokens), jnp.asarray(depths),
                                       jnp.asarray(ancestors))
    verdict = verify(jnp.asarray(tokens), logits)
    cache = compact(cache, base, verdict.path, verdict.path_len)
    path, path_len, nxt = (np.asarray(a) for a in (verdict.path, verdict.path_len, verdict.next_token))
    for r in range(2):
      emitted[r].extend(list(tokens[r, path[r, 1:path_len[r]]]) + [int(nxt[r])])
    accepted += int(np.sum(path_len - 1))
    root = nxt
  np.testing.assert_array_equal([e[:8] for e in emitted], greedy[:, :8])
  assert accepted >= 4, accepted  # drafts were accepted, at depths > 1 too


def test_every_family_is_a_tree_decoder():
  for family in ("llama2", "t5_v1_0"):
    decoder, _, cache, _ = setup(family)
    assert isinstance(decoder, contract.Decoder) and isinstance(cache, contract.DecoderCache)
    assert set(type(cache).position_fields) <= {f for f in type(cache).__dataclass_fields__}


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_fed_in_two_calls_is_one_call(family):
  """A tree fed depth by depth (a drafter growing it): the second call's nodes, given the first call's nodes as
  earlier ones (depths [B, P + N], ancestors [B, N, P + N]), get the logits and cache of one call over the
  whole tree; without their earlier ancestors (P = 0) they would not."""
  decoder, params, cache, vocab = setup(family)
  depths, ancestors = tree_arrays(PARENTS)
  tokens = np.random.RandomState(5).randint(3, vocab, size=PARENTS.shape).astype(np.int32)
  want, want_cache = step_tree(decoder)(params, cache, jnp.asarray(tokens), jnp.asarray(depths),
                                        jnp.asarray(ancestors))
  p = 3  # nodes 0..2 first, then the rest (parents before children in both rows)
  first, mid = step_tree(decoder)(params, cache, jnp.asarray(tokens[:, :p]), jnp.asarray(depths[:, :p]),
                                  jnp.asarray(ancestors[:, :p, :p]))
  second, got_cache = step_tree(decoder)(params, mid, jnp.asarray(tokens[:, p:]), jnp.asarray(depths),
                                         jnp.asarray(ancestors[:, p:, :]))
  np.testing.assert_allclose(np.concatenate([first, second], axis=1), want, rtol=1e-5, atol=1e-5)
  assert_same_cache(got_cache, want_cache, np.asarray(want_cache.lengths))
  alone, _ = step_tree(decoder)(params, mid, jnp.asarray(tokens[:, p:]), jnp.asarray(depths[:, p:]),
                                jnp.asarray(ancestors[:, p:, p:]))  # negative control: no earlier nodes
  assert not np.allclose(alone, want[:, p:], rtol=1e-3, atol=1e-3)


FEATURE_LAYERS = (0, 1, 2)  # the embedding, the input of layer 1, the input of layer 2 (2 layers: the final output)


@pytest.mark.parametrize("family", ["llama2", "mistral", "qwen3", "gemma2", "t5_v1_1"])
def test_tree_features_are_each_nodes_path_features(family):
  """`step(tree=..., layers=...)` (a feature head's verify call): the logits and cache of a tree step, and node
  n's features those of `step(layers=...)` fed n's root-to-node path, at n's depth (rows of different trees and
  prefixes)."""
  decoder, params, cache, vocab = setup(family)
  layers = FEATURE_LAYERS
  assert isinstance(decoder, contract.Decoder)
  depths, ancestors = tree_arrays(PARENTS)
  tokens = jnp.asarray(np.random.RandomState(6).randint(3, vocab, size=PARENTS.shape), jnp.int32)
  tree_args = (jnp.asarray(depths), jnp.asarray(ancestors))
  res = jax.jit(lambda p, c, t, d, a: decoder.step(p, c, t, tree=contract.TreeNodes(d, a), layers=layers))(
      params, cache, tokens, *tree_args)
  logits, features, got_cache = res.logits, res.features, res.cache
  want_logits, want_cache = step_tree(decoder)(params, cache, tokens, *tree_args)
  np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
  assert_same_cache(got_cache, want_cache, np.asarray(want_cache.lengths))
  jitted = jax.jit(decoder.step, static_argnames="layers")
  step_features = lambda p, c, t, l: (lambda r: (r.logits, r.features, r.cache))(jitted(p, c, t, layers=l))
  width = int(depths.max()) + 1
  tokens = np.asarray(tokens)
  for node in range(PARENTS.shape[1]):
    paths = np.zeros((2, width), np.int32)
    for r in range(2):
      path = path_to(PARENTS[r], node)
      paths[r, :len(path)] = tokens[r, path]
    _, want, _ = step_features(params, cache, jnp.asarray(paths), layers)
    for r in range(2):
      np.testing.assert_allclose(features[r, node], want[r, depths[r, node]], rtol=1e-4, atol=1e-4,
                                 err_msg=f"node {node} row {r}")
