"""One planner (jaxspec/decoding/planner.py) for `generate` / `lower` and every table entry of the slot engine: both
entry points get their loop settings from `planner.plan` (recorded here), the one-child tree -> chain rewrite is
the planner's, and a bad prompt is refused by the same check (`arguments.check_ids`) with the same words."""

from __future__ import annotations

import os
import sys

import pytest

import jaxspec
from jaxspec.decoding import generation, planner
from jaxspec.decoding.device import loop
from jaxspec.decoding.device.drafter import PlainDrafter
from jaxspec.errors import InputError, SettingsError
from jaxspec.serving import SlotEngine, SpeculationTable, TableEntry

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serving"))
from test_slot_engine_drafters import V, _llama  # pylint: disable=wrong-import-position

TABLE = SpeculationTable((TableEntry(max_active=1, gamma=3), TableEntry(max_active=2, gamma=3,
                                                                         tree=jaxspec.Tree(top_k=1, nodes=3)),
                          TableEntry(max_active=3, gamma=0)))
KW = dict(max_input_length=32, max_new_tokens=6, iterations_per_step=2, modes=("greedy", "sampled"))


@pytest.fixture(scope="module")
def models():
  return _llama(0), _llama(0, mix=0.07)


@pytest.fixture
def recorded(monkeypatch):
  calls = []
  real = planner.plan

  def plan(*args, **kwargs):
    out = real(*args, **kwargs)
    calls.append(out)
    return out

  monkeypatch.setattr(planner, "plan", plan)
  return calls


def test_a_one_child_tree_is_the_chain(models):
  target, draft = models
  drafter = planner.draft_source(target, jaxspec.Speculation(draft, gamma=3)).drafter
  step = planner.plan(target, drafter, "greedy", max_new_tokens=6, gamma=3, tree=jaxspec.Tree(top_k=1, nodes=3))
  chain = planner.plan(target, drafter, "greedy", max_new_tokens=6, gamma=3, tree=None)
  assert step == chain and step.settings.tree is None and step.kind == loop.IterationKind(rests=False, width=4)
  rest = planner.plan(target, drafter, "sampled", max_new_tokens=6, gamma=3, tree=None, plain=True, rests=True)
  assert (rest.settings.gamma, rest.kind, rest.settings.greedy) == (1, loop.IterationKind(rests=True, width=1), False)
  with pytest.raises(SettingsError, match="mode must be one of"):
    planner.plan(target, drafter, "fast", max_new_tokens=6, gamma=3, tree=None)


def test_generate_and_every_table_entry_are_planned_by_the_planner(models, recorded):
  target, draft = models
  spec = jaxspec.Speculation(draft, gamma=3, tree=jaxspec.Tree(top_k=1, nodes=3))
  call = generation._prepare(target, [[3, 5]], spec, jaxspec.Sampling(0.5, top_k=3), 6, 32, False)  # pylint: disable=protected-access
  assert [c.settings for c in recorded] == [call.settings]  # the tree of one child runs as the chain
  assert (call.settings.gamma, call.settings.tree, call.settings.filtering) == (3, None, True)
  recorded.clear()
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=3), slots=3, table=TABLE, **KW)
  planned = {c.settings for c in recorded}
  programs = engine._programs.values()  # pylint: disable=protected-access
  assert {p.settings for p in programs} | {f.settings for f in engine._first.values()} == planned  # pylint: disable=protected-access
  assert all(p.kind == next(c.kind for c in recorded if c.settings == p.settings) for p in programs)
  # The chain entry and the one-child tree entry are one program's settings; the plain entry leaves the lagging
  # draft model out (a plain engine's step: PlainDrafter, its state not carried).
  by_entry = {i: p for (i, mode, _), p in engine._programs.items() if mode == "greedy"}  # pylint: disable=protected-access
  assert by_entry[0].settings == by_entry[1].settings and by_entry[1].settings.tree is None
  assert (by_entry[2].settings.gamma, by_entry[2].kind) == (0, loop.IterationKind(rests=False, width=1))
  assert isinstance(by_entry[2].settings.drafter, PlainDrafter) and by_entry[2].draft_outside
  assert not by_entry[0].draft_outside


@pytest.mark.parametrize("prompt,words", [([], "is empty."), ([3, 1.5], "is not an integer: 1.5"),
                                          ([3, V], f"outside [0, {V})"), ([1] * 33, "more than max_input_length=32")])
def test_a_bad_prompt_is_refused_in_the_same_words(models, prompt, words):
  target, _ = models
  engine = SlotEngine(target, None, slots=1, max_input_length=32, max_new_tokens=4, modes=("greedy",))
  with pytest.raises(InputError) as served:
    engine.insert(0, prompt, jaxspec.serving.RequestSettings(max_tokens=2))
  with pytest.raises(InputError) as generated:
    jaxspec.generate(target, [prompt], max_new_tokens=2, max_input_length=32)
  assert words in str(served.value)
  assert str(served.value).replace("the prompt", "inputs row 0") == str(generated.value)


def test_sampling_owns_the_mode():
  """One greedy / sampled / filtered predicate: `generate`'s static settings and the slot engine's programs read
  `Sampling.mode` (a request's settings hold one Sampling)."""
  assert [jaxspec.Sampling(*a).mode for a in [(), (0.0, 5, 0.5), (0.7,), (0.7, 5), (0.7, 0, 0.9)]] == [
      "greedy", "greedy", "sampled", "filtered", "filtered"]
  assert jaxspec.serving.RequestSettings(4).sampling == jaxspec.Sampling()
