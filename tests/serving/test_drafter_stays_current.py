"""The drafter stays current at draft length 0 (issue 39, item 2): a request that drafts, then sits through a stretch
of plain steps (the table's plain entry while a second request runs beside it), drafts as well afterwards as the same
request alone, which drafts throughout: over the tokens after the stretch its accepted drafts are within a margin
of the request alone's over the same tokens (both runs emit the same greedy tokens; one iteration per step). For a
draft model (it lags through the stretch and its catch-up re-feeds the lag in one call: served_draft.py) and a
prompt lookup (its context follows the resting iterations: `Drafter.idle`, then `settle`). TensorRT-LLM's drafter
went stale at length 0 and acceptance silently collapsed when the load fell (#16888). The negative controls leave
the drafter stale: the draft model's catch-up (model_drafter.catch_up) limited to the 1- and 2-token calls of a
drafter that never rests (after the stretch it lags and drafts nothing until it has crept back), the lookup's
context not following resting iterations; the same check fails. (A feature head follows them as the lookup does;
the tiny random head accepts too little to measure here.)"""

from __future__ import annotations

import pytest

from jaxspec.decoding.drafters import model_drafter
from jaxspec.decoding.drafters.ngram import NGramDrafter
from jaxspec.serving import RequestSettings, SlotEngine, SpeculationTable, TableEntry

from engine_helpers import generate_tokens
from test_slot_engine_drafters import _case

REQUEST, FILLER = [12, 3, 3, 7, 1, 9], [8, 1, 12, 8, 1]  # greedy outputs of 40 and 12 tokens without EOS
MAX_NEW, FILLER_TOKENS, JOIN = 40, 12, 3  # the filler joins before step JOIN: a plain stretch of ~11 steps
TABLE = SpeculationTable((TableEntry(max_active=1, gamma=3), TableEntry(max_active=2, gamma=0)))
MARGIN = 0.8


def _engine(name: str, slots: int) -> SlotEngine:
  target, speculation = _case(name)
  return SlotEngine(target, speculation, slots=slots, max_input_length=16, max_new_tokens=MAX_NEW,
                    iterations_per_step=1, table=TABLE, modes=("greedy",))


def _run(engine: SlotEngine, filler: bool) -> tuple[list[int], list[tuple[int, bool, int, int]]]:
  """The request's tokens and per step (tokens before it, plain entry, drafted, accepted); with `filler`, the
  second request joins before step JOIN and runs its FILLER_TOKENS beside it (the table's plain entry)."""
  tokens = list(engine.insert(0, REQUEST, RequestSettings(MAX_NEW)).tokens)
  steps = []
  for step in range(4 * MAX_NEW):
    if filler and step == JOIN:
      assert not engine.insert(1, FILLER, RequestSettings(FILLER_TOKENS)).finished
    out = engine.step()
    steps.append((len(tokens), out.entry.plain, int(out.drafted[0]), int(out.accepted[0])))
    tokens += out.tokens[0]
    if out.finished[0]:
      assert not engine.active_slots()
      return tokens, steps
  raise AssertionError("the request did not finish")


def _accepted_after_the_stretch(engine: SlotEngine) -> tuple[int, int]:
  """(accepted drafts after the plain stretch with the filler, the request alone's over the same tokens)."""
  ref = generate_tokens(engine.target, REQUEST, MAX_NEW)
  assert len(ref) == MAX_NEW and len(generate_tokens(engine.target, FILLER, FILLER_TOKENS)) == FILLER_TOKENS
  tokens, steps = _run(engine, filler=True)
  alone_tokens, alone = _run(engine, filler=False)
  assert tokens == alone_tokens == ref  # exact either way
  plain = [i for i, s in enumerate(steps) if s[1]]
  assert plain == list(range(JOIN, plain[-1] + 1)) and len(plain) >= FILLER_TOKENS - 2  # one stretch
  assert all(s[2] == 0 for s in steps if s[1]) and sum(s[2] for s in steps[:JOIN]) > 0  # drafted before, not in it
  resumed = steps[plain[-1] + 1][0]  # the request's tokens when drafting resumed
  assert MAX_NEW - resumed >= 16  # enough tokens after the stretch to measure
  return (sum(s[3] for s in steps if s[0] >= resumed and not s[1]),
          sum(s[3] for s in alone if s[0] >= resumed))


@pytest.mark.parametrize("name", ["draft", "ngram"])
def test_a_request_drafts_as_well_after_a_plain_stretch(name):
  after, alone = _accepted_after_the_stretch(_engine(name, 2))
  assert alone >= 8 and after >= MARGIN * alone, (after, alone)


def _stale_when_resting(settle):
  """`settle` that keeps the drafter's state as it was in a resting iteration (a plain entry's: its block is
  [B, 2], gamma 1) instead of recording the verified token."""
  def stale(self, verdict):
    return verdict.proposal.after if verdict.block.shape[1] == 2 else settle(self, verdict)
  return stale


@pytest.mark.parametrize("name", ["draft", "ngram"])
def test_a_stale_drafter_is_caught(name, monkeypatch):
  """The draft model's catch-up limited to a lag of 1 (what a drafter that never rests needs); a lookup that
  records nothing while resting: the same check fails."""
  if name == "draft":
    original = model_drafter.catch_up
    monkeypatch.setattr(model_drafter, "catch_up",
                        lambda *args, **kwargs: original(*args, **{**kwargs, "variable": False, "refeed": False}))
  else:
    monkeypatch.setattr(NGramDrafter, "settle", _stale_when_resting(NGramDrafter.settle))
  after, alone = _accepted_after_the_stretch(_engine(name, 3))  # another slot count: a new trace, with the patch
  assert alone >= 8 and after < MARGIN * alone, (after, alone)
