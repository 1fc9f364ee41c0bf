"""Sampled slot-engine output keeps the target's distribution: 2000 seeded requests for one prompt (two new tokens
each) through a draft-model engine, requests joining slots as others leave, against the exact distribution of
two-token outputs computed from the target's own logits (temperature, top-k, top-p applied in numpy), by a
chi-square test at p ~ 3e-6 (temperature 2 flattens the tiny target's peaked distribution: ~20 outcomes
above the pooling threshold). The first token is drawn at insert (plain decoding), the second through the draft's
acceptance rule: with a fixed gamma (budget=False), as the verification budget rightly drafts nothing for a request
with one token left (each run checks that tokens were drafted). The negative control breaks the acceptance rule (the correction token drawn from p
instead of the residual) and the same statistic rejects it."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.device import verify
from jaxspec.serving import RequestSettings, SlotEngine

from stub_models import chi_square, chi_square_limit, np_warp
from test_slot_engine_drafters import EOS, V, _llama

PROMPT = [3, 5, 7, 9]
REQUESTS = 2000


def _exact(target: jaxspec.Model, temperature: float, top_k: int, top_p: float) -> dict:
  """{(x1,) or (x1, x2): probability} of the target's two-token outputs after PROMPT (EOS ends early)."""
  decoder = target.decoder()

  def next_logits(rows):
    ids = jnp.asarray(rows, jnp.int32)
    pre = decoder.prefill(target.params, ids, jnp.full((ids.shape[0],), ids.shape[1], jnp.int32), 4)
    return np.asarray(decoder.step(target.params, pre.cache, pre.first[:, None]).logits[:, 0], np.float64)

  p1 = np_warp(next_logits([PROMPT])[0], temperature, top_k, top_p)
  p2 = next_logits([PROMPT + [x] for x in range(V)])
  out = {}
  for x1 in range(V):
    if p1[x1] == 0:
      continue
    if x1 == EOS:
      out[(x1,)] = p1[x1]
      continue
    q = np_warp(p2[x1], temperature, top_k, top_p)
    for x2 in range(V):
      if q[x2] > 0:
        out[(x1, x2)] = p1[x1] * q[x2]
  return out


def _samples(engine: SlotEngine, settings: list[RequestSettings]) -> list[tuple]:
  """Every request's tokens, inserted into free slots as others finish."""
  todo, running, out, drafted = list(enumerate(settings)), {}, [None] * len(settings), 0
  for _ in range(10 * len(settings)):
    while todo and engine.free_slots():
      i, s = todo.pop()
      slot = engine.free_slots()[0]
      first = engine.insert(slot, PROMPT, s)  # the first token (drawn as plain decoding draws it)
      if first.finished:
        out[i] = tuple(first.tokens)
      else:
        running[slot] = (i, list(first.tokens))
    if not running and not todo:
      assert drafted > 0, "no token was drafted: the acceptance rule under test never ran"
      return out
    step = engine.step()
    drafted += int(step.drafted.sum())
    for slot in list(running):
      running[slot][1].extend(step.tokens[slot])
      if step.finished[slot]:
        i, tokens = running.pop(slot)
        out[i] = tuple(tokens)
  raise AssertionError("requests did not finish")


@pytest.fixture(scope="module")
def pair():
  return _llama(0), _llama(5)  # a draft of other weights: q differs from p, so the broken rule shows


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p", [(2.0, 0, 1.0), (0.8, 6, 0.9)])
def test_sampled_output_keeps_the_targets_distribution(pair, temperature, top_k, top_p):
  target, draft = pair
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=3), slots=32, max_input_length=16,
                      max_new_tokens=2, iterations_per_step=2, row_buckets=(32,), budget=False)
  sampling = jaxspec.Sampling(temperature, top_k=top_k, top_p=top_p)
  settings = [RequestSettings(2, sampling, seed=s) for s in range(REQUESTS)]
  stat, dof = chi_square(_samples(engine, settings), _exact(target, temperature, top_k, top_p))
  assert stat < chi_square_limit(dof), (stat, dof)


def test_a_broken_rule_is_caught(pair, monkeypatch):
  """The correction token drawn from p instead of the residual: the same statistic fails."""
  target, draft = pair
  monkeypatch.setattr(verify, "residual_probs", lambda p, q: p)
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=3), slots=31, max_input_length=16,  # a new trace
                      max_new_tokens=2, iterations_per_step=2, row_buckets=(31,), budget=False)
  settings = [RequestSettings(2, jaxspec.Sampling(2.0), seed=s) for s in range(REQUESTS)]
  stat, dof = chi_square(_samples(engine, settings), _exact(target, 2.0, 0, 1.0))
  assert stat > chi_square_limit(dof), (stat, dof)
