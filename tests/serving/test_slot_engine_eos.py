"""The slot engine's per-request EOS rules and the scope of its seeded-sampling promise, on the embedded T5 pair.

- ignore_eos: the request decodes past EOS to max_tokens; its greedy tokens equal plain greedy decoding that does
  not stop at EOS (a reference decoded token by token through the target's `Decoder` here), beside requests that do
  stop at EOS.
- min_tokens: no EOS among the first min_tokens tokens; greedy tokens equal plain greedy decoding with the EOS
  logit masked for them, for a speculative chain and a speculative tree; sampled requests never end before
  min_tokens (and without it some do: the check can fail).
- Seeded sampling: the same tokens alone and beside another request when the steps decode the same number of rows
  (one row bucket), in either slot, with a fixed gamma: what the engine promises (jaxspec/serving/engine.py,
  Exactness). The module's engine runs a fixed gamma (budget=False), whose programs do not depend on the
  neighbours' estimates as the verification budget's do.
- `step(program=...)` with a key the engine did not compile: a SettingsError naming `engine.programs`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.errors import SettingsError
from jaxspec.serving import RequestSettings, SlotEngine

from engine_helpers import Request, drive

TEXTS = ["Thank you.", "The house is small.", "Where is the station?", "Yes.", "We read a book."]
MAX_NEW = 16


@pytest.fixture(scope="module")
def pair():
  return jaxspec.load("ende-target"), jaxspec.load("ende-draft")


@pytest.fixture(scope="module")
def prompts(pair):
  return [pair[0].tokenizer.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def engine(pair):
  """A draft-model chain (a fixed gamma 3), 2 slots, one row bucket (every step decodes both), greedy and sampled."""
  e = SlotEngine(pair[0], jaxspec.Speculation(pair[1], gamma=3), slots=2, max_input_length=16,
                 max_new_tokens=MAX_NEW, iterations_per_step=2, row_buckets=(2,), modes=("greedy", "sampled"),
                 budget=False)
  e.warmup()
  return e


@pytest.fixture(scope="module")
def reference(pair):
  """Plain greedy decoding of the target alone, one token per call: (prompt, max_tokens, min_tokens, ignore_eos)
  -> tokens (EOS included; nothing after it unless ignore_eos)."""
  target = pair[0]
  decoder, params, eos = target.decoder(), target.params, list(target.config.eos_token_ids)
  step = jax.jit(lambda p, c, t: decoder.step(p, c, t))

  def decode(prompt, max_tokens, min_tokens=0, ignore_eos=False):
    out = decoder.prefill(params, jnp.asarray([prompt], jnp.int32), jnp.asarray([len(prompt)], jnp.int32),
                          MAX_NEW + 2)
    cache, last, tokens = out.cache, out.first[:, None].astype(jnp.int32), []
    while len(tokens) < max_tokens:
      res = step(params, cache, last)
      logits = np.array(res.logits[0, -1], np.float32)
      if len(tokens) < min_tokens:
        logits[eos] = -np.inf
      tokens.append(int(np.argmax(logits)))
      if tokens[-1] in eos and not ignore_eos:
        break
      cache, last = res.cache, jnp.asarray([[tokens[-1]]], jnp.int32)
    return tokens

  return decode


def _eos(pair):
  return set(pair[0].config.eos_token_ids)


def test_ignore_eos_decodes_past_eos_exactly(engine, pair, prompts, reference):
  eos = _eos(pair)
  requests = [Request(prompts[1], RequestSettings(MAX_NEW, ignore_eos=True)),
              Request(prompts[2], RequestSettings(MAX_NEW)),  # beside it, a request that stops at its EOS
              Request(prompts[4], RequestSettings(MAX_NEW, ignore_eos=True), arrive=1)]
  drive(engine, requests)
  for r in (requests[0], requests[2]):
    want = reference(r.prompt, MAX_NEW, ignore_eos=True)
    assert eos & set(want[:-1]), "the reference must pass an EOS (else ignore_eos is not tested)"
    assert r.tokens == want and r.reason == "length"
  assert requests[1].tokens == reference(prompts[2], MAX_NEW) and requests[1].reason == "stop"
  assert requests[1].tokens[-1] in eos


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_min_tokens_greedy_equals_plain_decoding_with_eos_masked(engine, pair, prompts, reference, tree):
  eng = engine
  if tree:  # a tree's nodes are masked by depth
    eng = SlotEngine(pair[0], jaxspec.Speculation(pair[1], gamma=3, tree=jaxspec.Tree(2, 6)), slots=2,
                     max_input_length=16, max_new_tokens=MAX_NEW, iterations_per_step=2, row_buckets=(2,),
                     modes=("greedy",))
  least = 9
  plain = [reference(p, MAX_NEW) for p in prompts]
  short = [i for i, t in enumerate(plain) if len(t) < least]
  assert len(short) >= 3, plain  # requests that would end before min_tokens without it
  requests = [Request(prompts[i], RequestSettings(MAX_NEW, min_tokens=least), arrive=n) for n, i in enumerate(short)]
  requests.append(Request(prompts[short[0]], RequestSettings(MAX_NEW)))  # no min_tokens: ends as before
  drive(eng, requests)
  for r in requests[:-1]:
    want = reference(r.prompt, MAX_NEW, min_tokens=least)
    assert len(want) > least and r.tokens == want
    assert not _eos(pair) & set(r.tokens[:least])
  assert requests[-1].tokens == plain[short[0]]


def test_min_tokens_sampled_never_ends_early(engine, pair, prompts):
  least, seeds = 8, range(10)

  def lengths(min_tokens):
    requests = [Request(prompts[3], RequestSettings(MAX_NEW, jaxspec.Sampling(1.0), seed=s, min_tokens=min_tokens))
                for s in seeds]
    drive(engine, requests)
    for r in requests:
      assert not _eos(pair) & set(r.tokens[:min_tokens]), r.tokens
    return [len(r.tokens) for r in requests]

  assert min(lengths(0)) < least  # without min_tokens some end earlier: the check below can fail
  assert min(lengths(least)) >= least


def test_seeded_sampling_is_the_same_within_a_row_bucket(engine, prompts):
  """Alone (slot 0, the other row idle) and beside another sampled request (in slot 1): one bucket of 2 rows."""
  settings = RequestSettings(MAX_NEW, jaxspec.Sampling(1.0), seed=11, ignore_eos=True)
  outputs = []
  alone = drive(engine, [Request(prompts[0], settings)], outputs=outputs)[0]
  busy = drive(engine, [Request(prompts[2], RequestSettings(MAX_NEW, jaxspec.Sampling(0.7), seed=5, ignore_eos=True)),
                        Request(prompts[0], settings)], outputs=outputs)
  assert busy[1].slots_used == [1] and alone.slots_used == [0]
  assert {o.rows for o in outputs if o.rows} == {2}
  assert busy[1].tokens == alone.tokens and len(alone.tokens) == MAX_NEW
  assert busy[0].tokens != alone.tokens  # the neighbour really decodes something else


def test_refusals(engine):
  with pytest.raises(SettingsError, match="min_tokens"):
    RequestSettings(4, min_tokens=5)
  with pytest.raises(SettingsError, match="min_tokens"):
    RequestSettings(4, min_tokens=-1)
  with pytest.raises(SettingsError, match="ignore_eos"):
    RequestSettings(4, ignore_eos="yes")
  for bad in [(0, "filtered", 2), (7, "greedy", 2), (0, "greedy", 1), [0, "greedy", 2], ([0], "greedy", 2), "x"]:
    with pytest.raises(SettingsError, match=r"engine\.programs"):
      engine.step(program=bad)
