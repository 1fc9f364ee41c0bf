"""jaxspec.generate: greedy exactness against plain decoding and transformers, stats, compilation, bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec.decoding import arguments, placement
from jaxspec.decoding.device import sampling

from conftest import load_hf_reference, write_hf_t5

MAX_NEW = 13  # deliberately not a multiple of gamma + 1 for any gamma tested


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """A tiny HF T5 1.1 target, and two drafts: a noisy copy of it (high acceptance) and an unrelated model."""
  root = tmp_path_factory.mktemp("pair")
  target_dir = write_hf_t5(str(root / "target"), "t5_v1_1", d_model=32, num_layers=3, num_decoder_layers=2,
                           num_heads=4, d_ff=64)
  target = jaxspec.load(target_dir, dtype=jnp.float32)
  noise = jax.tree.map(lambda x, k: x + 0.15 * jnp.std(x) * jax.random.normal(k, x.shape),
                       target.params, _keys_like(target.params))
  noisy = jaxspec.Model(target.config, noise, name="noisy")
  other = jaxspec.load(write_hf_t5(str(root / "other"), "t5_v1_0", seed=3), dtype=jnp.float32)
  return target_dir, target, noisy, other


def _keys_like(tree):
  leaves, treedef = jax.tree.flatten(tree)
  return jax.tree.unflatten(treedef, list(jax.random.split(jax.random.key(7), len(leaves))))


def _prompts(vocab, seed=0):
  rng = np.random.RandomState(seed)
  return [list(rng.randint(2, vocab, size=n)) + [1] for n in (4, 11, 1, 7)]


def _with_eos(model, eos):
  return dataclasses.replace(model, config=dataclasses.replace(model.config, eos_token_id=eos))


def _hf_greedy(target_dir, prompts, eos, max_new):
  ref = load_hf_reference(target_dir)
  width = max(map(len, prompts))
  ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
  with torch.no_grad():
    out = ref.generate(input_ids=ids, attention_mask=ids != 0, do_sample=False, num_beams=1,
                       max_new_tokens=max_new, eos_token_id=eos, pad_token_id=0).numpy()
  return out[:, 1:]  # drop the decoder start token


def _ragged_eos(tokens):
  """A token whose first occurrence differs between rows (and is not at the start): used as EOS, it ends the
  rows at different, mid-sequence positions."""
  best, best_spread = None, -1
  for tok in range(2, tokens.max() + 1):
    first = [int(np.argmax(row == tok)) if (row == tok).any() else len(row) for row in tokens]
    if min(first) < 2:
      continue
    spread = len(set(first))
    if spread > best_spread:
      best, best_spread = tok, spread
  return best


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
def test_greedy_speculative_equals_plain_and_transformers(pair, gamma):
  target_dir, target, noisy, other = pair
  prompts = _prompts(target.config.vocab_size)
  plain = jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW)
  eos = _ragged_eos(plain.tokens)
  target_e, noisy_e, other_e = (_with_eos(m, eos) for m in (target, noisy, other))
  plain_e = jaxspec.generate(target_e, prompts, max_new_tokens=MAX_NEW)
  hf = _hf_greedy(target_dir, prompts, eos, MAX_NEW)
  assert len(set(plain_e.lengths.tolist())) > 1 and plain_e.lengths.min() < MAX_NEW  # EOS ends rows raggedly
  for n, row, hf_row in zip(plain_e.lengths, plain_e.tokens, hf):
    np.testing.assert_array_equal(row[:n], hf_row[:n])
    assert (row[n:] == 0).all()
    assert n == MAX_NEW or row[n - 1] == eos
  accepted = {}
  for name, draft in (("noisy", noisy_e), ("other", other_e)):
    spec = jaxspec.generate(target_e, prompts, jaxspec.Speculation(draft, gamma=gamma), max_new_tokens=MAX_NEW)
    np.testing.assert_array_equal(spec.tokens, plain_e.tokens)
    np.testing.assert_array_equal(spec.lengths, plain_e.lengths)
    accepted[name] = spec.stats.accepted.sum()
  # With the noisy draft, blocks of several tokens are accepted, so EOS lands inside accepted blocks.
  assert accepted["noisy"] > 0
  # Without an EOS cut, plain decoding also equals transformers.
  np.testing.assert_array_equal(plain.tokens, _hf_greedy(target_dir, prompts, 1, MAX_NEW)[:, :MAX_NEW])


def test_batch_of_one_equals_plain(pair):
  """At batch 1 the draft's first call is 1 token, or 2 after a fully accepted block: both paths are taken."""
  _, target, noisy, _ = pair
  full = rejected = 0
  for prompt in _prompts(target.config.vocab_size):
    plain = jaxspec.generate(target, [prompt], max_new_tokens=MAX_NEW)
    spec = jaxspec.generate(target, [prompt], jaxspec.Speculation(noisy, gamma=2), max_new_tokens=MAX_NEW)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    full += int(spec.stats.accepted_per_position[0, -1])  # iterations that accepted all gamma drafts
    rejected += int(spec.stats.iterations[0] - spec.stats.accepted_per_position[0, -1])
  assert full > 0 and rejected > 0


def test_self_draft_accepts_everything(pair):
  _, target, _, _ = pair
  prompts = _prompts(target.config.vocab_size)
  out = jaxspec.generate(target, prompts, jaxspec.Speculation(target, gamma=3), max_new_tokens=12)
  s = out.stats
  assert s.alpha == 1.0 and s.acceptance_rate == 1.0
  full_rows = out.lengths == 12
  assert np.all(s.iterations[full_rows] == 3)  # 12 tokens in blocks of gamma + 1 = 4
  assert np.all(s.accepted_per_position[full_rows] == 3)


def test_stats_are_consistent(pair):
  _, target, noisy, _ = pair
  out = jaxspec.generate(target, _prompts(target.config.vocab_size), jaxspec.Speculation(noisy, gamma=4), max_new_tokens=MAX_NEW)
  s = out.stats
  assert np.all(s.generated == out.lengths)
  assert np.all(s.drafted == 4 * s.iterations)
  assert np.all(s.accepted_per_position.sum(1) == s.accepted)
  assert np.all(np.diff(s.accepted_per_position, axis=1) <= 0)  # position j+1 accepted only if j was
  assert np.all(s.generated <= s.accepted + s.iterations)  # each iteration: accepted drafts + 1 token at most
  assert 0 < s.alpha < 1 and s.tokens_per_iteration == pytest.approx(s.generated.sum() / s.iterations.sum())
  # Stats of several calls combine into batch means over all their rows.
  both = jaxspec.DecodeStats.concatenate([s, s])
  assert both.alpha == pytest.approx(s.alpha) and both.iterations.shape == (2 * len(s.iterations),)
  np.testing.assert_allclose(both.acceptance_per_position, s.acceptance_per_position)
  # Selecting rows gives those rows' means; selecting every row changes nothing.
  first = s.select(slice(0, 1))
  assert first.alpha == pytest.approx(s.beta_sum[0] / s.beta_count[0]) and first.iterations.shape == (1,)
  assert s.select(np.ones(len(s.iterations), bool)).alpha == pytest.approx(s.alpha)


def test_sampling_is_reproducible_and_seed_dependent(pair):
  _, target, noisy, _ = pair
  prompts = _prompts(target.config.vocab_size)
  kw = dict(speculation=jaxspec.Speculation(noisy, gamma=3), sampling=jaxspec.Sampling(1.0, top_k=20, top_p=0.9),
            max_new_tokens=MAX_NEW)
  a = jaxspec.generate(target, prompts, seed=1, **kw)
  b = jaxspec.generate(target, prompts, seed=1, **kw)
  c = jaxspec.generate(target, prompts, seed=2, **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, c.tokens)


@pytest.mark.parametrize("top_p", [1e-300, 1e-44])  # 0 in float32; a denormal (flushed to 0 on accelerators)
def test_a_top_p_too_small_for_float32_keeps_the_top_token(pair, top_p):
  """A top_p float32 cannot hold (or a device flushes) once kept no token, and the cutoff then kept them all:
  sampling from the whole distribution. The nucleus keeps the most likely token: the greedy text, speculative or
  not."""
  _, target, noisy, _ = pair
  prompts = _prompts(target.config.vocab_size)
  greedy = jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW)
  for speculation in (None, jaxspec.Speculation(noisy, gamma=3)):
    for seed in (1, 2):
      out = jaxspec.generate(target, prompts, speculation, jaxspec.Sampling(1.0, top_p=top_p),
                             max_new_tokens=MAX_NEW, seed=seed)
      np.testing.assert_array_equal(out.tokens, greedy.tokens)
  logits = jnp.asarray([[0.5, 2.0, 1.0, -1.0], [3.0, 0.0, 2.9, 1.0]])
  probs = sampling.warp_probs(logits, sampling.SamplingKnobs.create(1.0, 0, top_p), filtering=True)
  np.testing.assert_array_equal(np.asarray(probs), np.eye(4, dtype=np.float32)[[1, 0]])
  rows = sampling.SamplingKnobs(temperature=np.float32([1.0, 1.0]), top_k=np.int32([0, 0]),  # the slot engine's
                                top_p=np.float32([top_p, 1.0]))                               # per-row knobs
  probs = np.asarray(sampling.warp_probs(logits, rows, filtering=True))
  np.testing.assert_array_equal(probs[0], np.eye(4, dtype=np.float32)[1])
  assert (probs[1] > 0).all()  # the other row keeps its whole distribution


def test_same_bucket_does_not_recompile(pair):
  _, target, noisy, _ = pair
  jaxspec.generate(target, [[5, 6, 7, 1]], jaxspec.Speculation(noisy, gamma=2), jaxspec.Sampling(temperature=0.5),
                   max_new_tokens=6)
  sizes = placement.compiled_counts()
  # Another prompt of another length in the same bucket, other sampling values and seed: no new compilation.
  jaxspec.generate(target, [[9, 8, 7, 6, 5, 4, 3, 1]], jaxspec.Speculation(noisy, gamma=2),
                   jaxspec.Sampling(temperature=0.9, top_k=0, top_p=1.0), max_new_tokens=6, seed=5)
  assert placement.compiled_counts() == sizes
  # A new gamma is a new program: the count above can change.
  jaxspec.generate(target, [[5, 6, 7, 1]], jaxspec.Speculation(noisy, gamma=7), max_new_tokens=6)
  assert placement.compiled_counts()[1] > sizes[1]
  assert arguments.bucket_length(8, 512) == 16 and arguments.bucket_length(17, 512) == 32


def test_padded_array_inputs_equal_lists(pair):
  _, target, _, _ = pair
  prompts = _prompts(target.config.vocab_size)
  array = np.zeros((len(prompts), 20), np.int32)
  for i, p in enumerate(prompts):
    array[i, :len(p)] = p
  a = jaxspec.generate(target, prompts, max_new_tokens=5)
  b = jaxspec.generate(target, array, max_new_tokens=5)
  np.testing.assert_array_equal(a.tokens, b.tokens)


def test_bad_input_is_a_clear_error(pair):
  _, target, noisy, other = pair
  prompts = [[5, 6, 1]]
  small_vocab = dataclasses.replace(other, config=dataclasses.replace(other.config, vocab_size=50))
  cases = [
      (lambda: jaxspec.generate(target, prompts, jaxspec.Speculation(small_vocab)), "vocabularies differ"),
      (lambda: jaxspec.generate(target, prompts, jaxspec.Speculation(_with_eos(noisy, 7))),
       "special ids differ: eos_token_id"),
      (lambda: jaxspec.Speculation(noisy, gamma=0), r"gamma must be an integer in \[1, 256\]"),
      (lambda: jaxspec.Sampling(temperature=-0.5), "temperature must be a finite number >= 0"),
      (lambda: jaxspec.Sampling(top_p=0.0), r"top_p must be in \(0, 1\]"),
      (lambda: jaxspec.Sampling(top_p=1.5), r"top_p must be in \(0, 1\]"),
      (lambda: jaxspec.Sampling(top_k=-1), "top_k must be an integer >= 0"),
      (lambda: jaxspec.generate(target, prompts, max_new_tokens=0), r"max_new_tokens must be an integer in \[1,"),
  ]
  for call, message in cases:
    with pytest.raises(jaxspec.JaxspecError, match=message):
      call()
  with pytest.raises(ValueError, match="more than max_input_length=8"):
    jaxspec.generate(target, [list(range(2, 12))], max_input_length=8)
  with pytest.raises(ValueError, match="empty batch"):
    jaxspec.generate(target, [])
  with pytest.raises(ValueError, match="row 1 is empty"):
    jaxspec.generate(target, [[5, 1], []])
  with pytest.raises(ValueError, match="outside"):
    jaxspec.generate(target, [[5, 10_000]])
  with pytest.raises(ValueError, match="no tokenizer"):
    jaxspec.generate(target, ["a text"])
