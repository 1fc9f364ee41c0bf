"""generate(..., on_tokens=callback): each iteration's new tokens reach the host in order, exactly the output."""

import dataclasses
import re

import jax
import pytest

import jaxspec
from jaxspec.decoding import placement
from jaxspec.models import t5
from test_adaptive import _ragged_eos

PROMPTS = [[3, 4, 5, 1], [9, 8, 1], [2, 2, 3, 4, 5, 6, 1], [11, 1], [5, 6, 7, 8, 9, 1]]


@pytest.fixture(scope="module")
def pair():
  cfg = t5.T5Config(vocab_size=30, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=2, num_heads=4,
                    activation="gelu_new", gated=True, tie_word_embeddings=False, scale_decoder_outputs=False)
  params = t5.init_params(cfg, jax.random.key(0))
  eos = _ragged_eos(jaxspec.generate(jaxspec.Model(cfg, params), PROMPTS, max_new_tokens=15).tokens)
  cfg = dataclasses.replace(cfg, eos_token_id=eos)
  leaves, treedef = jax.tree.flatten(params)
  noise = [x + 0.2 * x.std() * jax.random.normal(k, x.shape)
           for x, k in zip(leaves, jax.random.split(jax.random.key(1), len(leaves)))]
  return jaxspec.Model(cfg, params, name="target"), jaxspec.Model(cfg, jax.tree.unflatten(treedef, noise))


@pytest.mark.parametrize("spec,kw", [
    (None, dict()),  # plain decoding
    (dict(gamma=3), dict()),
    (dict(gamma=2), dict(sampling=jaxspec.Sampling(0.9, top_k=10), seed=4)),
    (dict(gamma=4, schedule="adaptive", draft_confidence=0.3, fallback_alpha=0.5, probe_interval=2), dict()),
    (dict(gamma=3, draft="ngram"), dict()),
])
def test_chunks_are_the_output_in_order(pair, spec, kw):
  target, draft = pair
  gamma = 0
  if spec is not None:
    spec = dict(spec, draft=jaxspec.NGramDraft() if spec.get("draft") == "ngram" else draft)
    gamma = spec["gamma"]
    kw = dict(kw, speculation=jaxspec.Speculation(**spec))
  chunks = []
  out = jaxspec.generate(target, PROMPTS, max_new_tokens=15, on_tokens=chunks.append, **kw)
  assert [c.iteration for c in chunks] == list(range(len(chunks)))
  assert len(chunks) == out.stats.iterations.max()  # one chunk per iteration, none after the last
  assert all(later.time >= earlier.time for earlier, later in zip(chunks, chunks[1:]))
  streamed = [[] for _ in PROMPTS]
  for c in chunks:
    assert c.tokens.shape == (len(PROMPTS), gamma + 1) and c.counts.shape == (len(PROMPTS),)
    for row, new in enumerate(c.rows()):
      streamed[row] += new
  for row, tokens in enumerate(streamed):
    assert tokens == out.tokens[row, :out.lengths[row]].tolist()
  assert len(set(out.lengths.tolist())) > 1  # rows ended at different iterations


def _callback_targets(target, draft, stream: bool) -> set:
  """The host-callback custom calls in the compiled loop, streaming or not."""
  hlo = jaxspec.lower(target, PROMPTS, jaxspec.Speculation(draft, gamma=3), max_new_tokens=8,
                      on_tokens=print if stream else None).loop_hlo()
  return {t for t in re.findall(r'custom_call_target="([^"]+)"', hlo) if "callback" in t}


def test_no_callback_is_compiled_without_on_tokens(pair):
  target, draft = pair
  assert _callback_targets(target, draft, stream=True)  # the marker is found when there is a callback
  assert not _callback_targets(target, draft, stream=False)


def test_a_new_callback_does_not_recompile_and_its_errors_surface(pair):
  target, draft = pair
  jaxspec.generate(target, PROMPTS, jaxspec.Speculation(draft, gamma=2), max_new_tokens=8, on_tokens=lambda c: None)
  sizes = placement.compiled_counts()
  seen = []
  jaxspec.generate(target, PROMPTS, jaxspec.Speculation(draft, gamma=2), max_new_tokens=8,
                   on_tokens=lambda c: seen.append(c))
  assert placement.compiled_counts() == sizes and seen

  def broken(chunk):
    raise KeyError("from the callback")

  with pytest.raises(KeyError, match="from the callback"):
    jaxspec.generate(target, PROMPTS, jaxspec.Speculation(draft, gamma=2), max_new_tokens=8, on_tokens=broken)
  with pytest.raises(ValueError, match="on_tokens must be a callable"):
    jaxspec.generate(target, PROMPTS, on_tokens="print")
