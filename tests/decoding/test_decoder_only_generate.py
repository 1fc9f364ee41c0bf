"""jaxspec.generate with decoder-only families: greedy speculative == plain == transformers' generate for ragged
batches and several EOS ids, texts in / new tokens out, lossless sampling with a decoder-only pair, vocabularies
padded beyond a shared tokenizer, and bad pairs."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec.decoding.device import loop, sampling
from jaxspec.decoding import placement
from jaxspec.decoding.arguments import bucket_length
from jaxspec.decoding.drafters.model_drafter import ModelDrafter
from jaxspec.models import decoder_only as do
from jaxspec.models.decoder_only.llama import LlamaConfig
from jaxspec.models.decoder_only.qwen import QwenConfig

from decoder_only_models import (EOS, TOKENIZER_SIZE, VARIANTS, checkpoint_dirs, load_hf_reference,
                                 ragged_prompts)
from stub_models import chi_square, chi_square_limit, exact_sequence_probs, np_warp

MAX_NEW = 13  # not a multiple of gamma + 1
PROMPT_LENGTHS = (3, 9, 14, 6)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  return checkpoint_dirs(tmp_path_factory)


def _noisy(model: jaxspec.Model, scale: float = 0.1, seed: int = 7) -> jaxspec.Model:
  """A draft that agrees with the target most of the time: its parameters plus noise."""
  leaves, treedef = jax.tree.flatten(model.params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return jaxspec.Model(model.config, jax.tree.unflatten(treedef, noisy), model.tokenizer, name="noisy")


def _with_eos(model: jaxspec.Model, eos: tuple[int, ...]) -> jaxspec.Model:
  return dataclasses.replace(model, config=dataclasses.replace(model.config, eos_ids=eos))


def _hf_greedy(ref, prompts, max_new, eos):
  """transformers' greedy new tokens, one row at a time (no padding: its left padding would shift windows)."""
  out = []
  for p in prompts:
    with torch.no_grad():
      ids = ref.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                         do_sample=False, max_new_tokens=max_new, eos_token_id=list(eos), pad_token_id=0)
    out.append(ids[0, len(p):].tolist())
  return out


def _ragged_eos(rows):
  """A token whose first occurrence differs between rows (never at the start): as EOS it ends rows raggedly."""
  best, best_spread = None, -1
  for tok in sorted({t for r in rows for t in r}):
    first = [r.index(tok) if tok in r else len(r) for r in rows]
    if min(first) >= 2 and len(set(first)) > best_spread:
      best, best_spread = tok, len(set(first))
  return best


def _assert_rows_equal(out, rows):
  for n, got, want in zip(out.lengths, out.tokens, rows):
    assert got[:n].tolist() == want


@pytest.fixture(scope="module")
def greedy(dirs):
  """greedy(variant) -> (target with two EOS ids, its ragged prompts, transformers' greedy rows, plain output),
  computed once per variant and shared by this module's tests: those that reuse a variant's target, batch, prompt
  bucket and max_new_tokens reuse its compiled programs (the EOS ids, batch size and bucket are all static)."""
  cache = {}

  def get(variant):
    if variant not in cache:
      target = jaxspec.load(dirs[variant], dtype=jnp.float32)
      ref = load_hf_reference(dirs[variant])
      prompts = ragged_prompts(PROMPT_LENGTHS, seed=5)
      eos = (EOS, _ragged_eos(_hf_greedy(ref, prompts, MAX_NEW, (EOS,))))
      hf = _hf_greedy(ref, prompts, MAX_NEW, eos)
      target = _with_eos(target, eos)
      cache[variant] = target, prompts, hf, jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW)
    return cache[variant]
  return get


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_greedy_speculative_equals_plain_and_transformers(greedy, variant):
  """Ragged prompts, two EOS ids (one ending rows at different mid-sequence steps, inside accepted blocks)."""
  target, prompts, hf, plain = greedy(variant)
  assert len({len(r) for r in hf}) > 1 and min(len(r) for r in hf) < MAX_NEW  # EOS ends rows raggedly
  _assert_rows_equal(plain, hf)
  assert all((row[n:] == target.config.pad_token_id).all() for row, n in zip(plain.tokens, plain.lengths))
  spec = jaxspec.generate(target, prompts, jaxspec.Speculation(_noisy(target), gamma=3), max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  assert spec.stats.accepted.sum() > 0 and spec.stats.accepted.sum() < spec.stats.drafted.sum()
  tree = jaxspec.Speculation(_noisy(target), gamma=3, tree=jaxspec.Tree(top_k=3, nodes=8))  # token trees too
  spec = jaxspec.generate(target, prompts, tree, max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  assert spec.stats.accepted.sum() > 0


def test_a_draft_of_another_family_with_the_same_tokenizer(greedy, dirs):
  """A Gemma 3 target drafted by a Llama model that shares its tokenizer (the greedy test's target and plain run)."""
  target, prompts, _, plain = greedy("gemma3")
  draft = jaxspec.load(dirs["llama2"], dtype=jnp.float32)
  spec = jaxspec.generate(target, prompts, jaxspec.Speculation(draft, gamma=2), max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)


def test_texts_in_only_new_tokens_out(greedy, dirs):
  """Four texts (a batch of 4 in the 16-token bucket, as the greedy test's: its compiled chain program)."""
  target, _, _, _ = greedy("qwen3")
  hf_tok = target.tokenizer.hf_tokenizer
  texts = ["the cat reads a book.", "green water under the bright morning light.", "a small dog runs.",
           "the river sings over the stone."]
  ids = [hf_tok(t)["input_ids"] for t in texts]
  assert max(map(len, ids)) <= 16 and len({len(i) for i in ids}) > 1, ids
  out = jaxspec.generate(target, texts, jaxspec.Speculation(_noisy(target), gamma=3), max_new_tokens=MAX_NEW)
  hf = _hf_greedy(load_hf_reference(dirs["qwen3"]), ids, MAX_NEW, target.config.eos_ids)
  _assert_rows_equal(out, hf)
  assert out.texts == [hf_tok.decode(r, skip_special_tokens=True) for r in hf]


def test_same_bucket_does_not_recompile(greedy):
  """A second call whose prompts differ in length but not in bucket (16) compiles nothing (the first may, when
  this test runs alone; after the greedy test it reuses that test's chain programs)."""
  target, prompts, _, _ = greedy("gemma2")
  spec = jaxspec.Speculation(target, gamma=3)
  jaxspec.generate(target, prompts, spec, max_new_tokens=MAX_NEW)
  sizes = placement.compiled_counts()
  shorter = ragged_prompts((2, 5, 10, 4), seed=8)
  assert bucket_length(max(map(len, shorter)), 512) == bucket_length(max(map(len, prompts)), 512) == 16
  jaxspec.generate(target, shorter, spec, max_new_tokens=MAX_NEW)
  assert placement.compiled_counts() == sizes


def _resized(model: jaxspec.Model, vocab: int) -> jaxspec.Model:
  """The model with its embedding (and lm_head) cut to, or padded with random rows up to, `vocab` rows."""
  def fit(x, axis):
    if x.shape[axis] >= vocab:
      return jax.lax.slice_in_dim(x, 0, vocab, axis=axis)
    extra = list(x.shape)
    extra[axis] = vocab - x.shape[axis]
    return jnp.concatenate([x, 0.1 * jax.random.normal(jax.random.key(0), extra)], axis=axis)
  params = dict(model.params, embedding=fit(model.params["embedding"], 0))
  if "lm_head" in params:
    params["lm_head"] = fit(params["lm_head"], 1)
  config = dataclasses.replace(model.config, vocab_size=vocab)
  return jaxspec.Model(config, params, model.tokenizer, name=f"vocab{vocab}")


def test_vocabularies_padded_beyond_the_tokenizer(greedy):
  """Draft embeddings with fewer or more padding rows than the target's (same tokenizer) stay exact; a draft
  vocabulary smaller than the tokenizer is refused."""
  target, prompts, _, plain = greedy("llama2")
  for vocab in (124, 136):
    draft = _resized(_noisy(target), vocab)
    spec = jaxspec.generate(target, prompts, jaxspec.Speculation(draft, gamma=3), max_new_tokens=MAX_NEW)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    assert spec.stats.accepted.sum() > 0
  with pytest.raises(ValueError, match="vocabularies differ"):
    jaxspec.generate(target, prompts, jaxspec.Speculation(_resized(target, TOKENIZER_SIZE - 8), gamma=3))


def test_bad_pairs_and_inputs_are_clear_errors(dirs):
  target = jaxspec.load(dirs["llama3"])
  t5 = jaxspec.load("ende-draft")
  with pytest.raises(ValueError, match="encoder-decoder and a decoder-only"):
    jaxspec.generate(target, [[1, 5, 6]], jaxspec.Speculation(t5))
  other_tokenizer = jaxspec.Model(target.config, target.params, t5.tokenizer)
  with pytest.raises(ValueError, match="tokenizers differ"):
    jaxspec.generate(target, [[1, 5, 6]], jaxspec.Speculation(other_tokenizer))
  with pytest.raises(ValueError, match="more than max_input_length=8"):
    jaxspec.generate(target, [list(range(6, 16))], max_input_length=8)


# Lossless sampling with a real decoder-only pair: exact enumeration of the target's sequence distribution. ROWS:
# as test_sampling_lossless.py's draft-model tests, whose negative controls show that 2000 rows reject a biased
# correction rule by several standard deviations (the limit keeps a correct rule's false failures at ~3e-6).
VOCAB, LENGTH, LOSSLESS_EOS, ROWS = 5, 3, 4, 2000
PROMPT = [1, 3, 2, 0]


def test_lossless_with_real_tiny_decoder_only_pair():
  """A Llama target and a Qwen3 draft (vocabulary of 5, EOS 4); chi-square against teacher-forced probabilities."""
  small = dict(vocab_size=VOCAB, intermediate_size=16, num_heads=2, head_dim=4, bos_token_id=1,
               eos_ids=(LOSSLESS_EOS,), pad_token_id=0)
  tcfg = LlamaConfig(**small, hidden_size=8, num_layers=2, num_kv_heads=1, tie_word_embeddings=False)
  dcfg = QwenConfig(**small, model_type="qwen3", hidden_size=8, num_layers=1, num_kv_heads=2, qk_norm=True)
  init = jax.jit(do.init_params, static_argnums=0, static_argnames="std")  # one program each, not one per shape
  tparams, dparams = init(tcfg, jax.random.key(0), std=0.6), init(dcfg, jax.random.key(1), std=0.6)
  temperature = 0.8

  # Every decoder prefix's next-token logits from one causal pass (not one pass per prefix): the prompt followed by
  # each of the (VOCAB - 1)^(LENGTH - 1) continuations without EOS; the logits at the prompt's last position + k
  # are those of the prefix (PROMPT[-1], first k continuation tokens).
  tokens = [t for t in range(VOCAB) if t != LOSSLESS_EOS]
  rows = np.asarray([PROMPT + list(c) for c in itertools.product(tokens, repeat=LENGTH - 1)], np.int32)
  logits = np.asarray(jax.jit(do.forward, static_argnums=1)(tparams, tcfg, jnp.asarray(rows)))
  last = len(PROMPT) - 1
  prefix_logits = {tuple(row[last:last + k + 1]): row_logits[last + k] for row, row_logits in zip(rows, logits)
                   for k in range(LENGTH)}
  exact = exact_sequence_probs(lambda prefix: np_warp(prefix_logits[tuple(prefix)], temperature), VOCAB, LENGTH,
                               LOSSLESS_EOS, PROMPT[-1])
  settings = loop.LoopSettings(target=do.CausalDecoder(tcfg), drafter=ModelDrafter(do.CausalDecoder(dcfg)), gamma=2,
                               max_new_tokens=LENGTH, greedy=False, filtering=False, eos_ids=(LOSSLESS_EOS,),
                               pad_id=0)
  ids = jnp.tile(jnp.asarray([PROMPT], jnp.int32), (ROWS, 1))
  lengths = jnp.full((ROWS,), len(PROMPT), jnp.int32)
  tc, dc, first = jax.jit(loop.prefill, static_argnums=0)(settings, tparams, dparams, ids, lengths)
  state = jax.jit(loop.run, static_argnums=0)(settings, tparams, dparams, tc, dc, first,
                                               sampling.SamplingKnobs.create(temperature, 0, 1.0),
                                               np.zeros((ROWS,), np.uint32), np.arange(ROWS, dtype=np.int32))
  seqs, lens = jax.device_get((state.sequences, state.lengths))
  samples = [tuple(s[1:n]) for s, n in zip(seqs, lens)]
  stat, dof = chi_square(samples, exact)
  assert stat < chi_square_limit(dof), (stat, dof)
  assert 0 < int(state.stats.accepted.sum()) < int(state.stats.drafted.sum())  # the draft's tokens were used
