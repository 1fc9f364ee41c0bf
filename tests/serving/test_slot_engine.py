"""The slot engine on the embedded T5 pair (jaxspec.load("ende-target") / "ende-draft"): at temperature 0 every
request's tokens equal `generate`'s plain greedy tokens for its prompt alone, whatever else runs beside it
(requests joining and leaving mid-decode, slots reused, a slot freed early), under the verification budget (the
default: each step's draft length chosen from the rows' estimates, tests/serving/test_budget.py); with a fixed
gamma (budget=False: the budget's choice depends on the neighbours' estimates), seeded sampled requests give the
same tokens alone and under load (the first one plain generate's with seed=[s]) within one row bucket, as the engine
promises (another bucket's programs may round apart: test_slot_engine_eos.py); nothing recompiles after warmup; bad
settings and prompts are refused with one clear error."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jaxspec
from jaxspec.decoding.device import slots as slot_programs
from jaxspec.errors import InputError, SettingsError
from jaxspec.models.t5 import T5Cache
from jaxspec.serving import RequestSettings, SlotEngine

from engine_helpers import Request, cost_curves, drive, generate_tokens

TEXTS = ["translate English to German: The house is small.",
         "translate English to German: I like green tea very much because it is good.",
         "translate English to German: Where is the station?",
         "translate English to German: The weather today is cold and the children stay inside the house.",
         "translate English to German: Thank you."]
MAX_NEW = 24


@pytest.fixture(scope="module")
def pair():
  return jaxspec.load("ende-target"), jaxspec.load("ende-draft")


@pytest.fixture(scope="module")
def prompts(pair):
  return [pair[0].tokenizer.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def greedy_refs(pair, prompts):
  return [generate_tokens(pair[0], p, MAX_NEW) for p in prompts]


@pytest.fixture(scope="module")
def engine(pair):
  """A draft-model engine (gamma 2, the verification budget: 3 tiers), 3 slots, 2 iterations per step, greedy
  programs only (the sampled ones: the fixed engine of the seeded-sampling test), warmed up."""
  e = SlotEngine(pair[0], jaxspec.Speculation(pair[1], gamma=2), slots=3, max_input_length=32,
                 max_new_tokens=MAX_NEW, iterations_per_step=2, modes=("greedy",))
  e.warmup()
  return e


def _mixed_load(prompts, settings_of):
  """Seven requests over 3 slots: joining at different steps, two cut short by max_tokens, one freed early."""
  plan = [(0, 0), (1, 0), (2, 1), (3, 3), (4, 3), (0, 4), (3, 6)]
  requests = [Request(prompts[i], settings_of(i, n), arrive=a) for n, (i, a) in enumerate(plan)]
  requests[5].stop_after = 3  # a client gone after 3 tokens (its slot is reused)
  return requests


def test_greedy_equals_plain_generate_under_load(engine, prompts, greedy_refs, monkeypatch):
  # The budget's choice follows the step costs warmup timed, which follow this machine's load: cost curves set here
  # (a draft token at a tenth of a plain step, nothing learnt from the steps served) make it draft whatever the
  # load, so that the equality below is speculative decoding's.
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.1))
  monkeypatch.setattr(engine, "budget", dataclasses.replace(engine.budget, learn=0.0))
  before = engine.compiled_programs()
  budgets = [MAX_NEW, 5, MAX_NEW, MAX_NEW, 9, MAX_NEW, MAX_NEW]
  outputs = []
  requests = drive(engine, _mixed_load(prompts, lambda i, n: RequestSettings(max_tokens=budgets[n])),
                   outputs=outputs)
  for r, (i, _), budget in zip(requests, [(0, 0), (1, 0), (2, 1), (3, 3), (4, 3), (0, 4), (3, 6)], budgets):
    want = greedy_refs[i][:budget]
    if r.reason == "freed":
      assert r.tokens == want[:len(r.tokens)] and len(r.tokens) >= 3
      continue
    assert r.tokens == want, (i, r.tokens, want)
    assert r.reason == ("stop" if want[-1] in engine.eos_ids else "length")
  assert len({s for r in requests for s in r.slots_used}) == 3  # every slot used, some twice
  assert engine.compiled_programs() == before  # nothing recompiled after warmup
  assert any(o.drafted.any() for o in outputs)  # the budget drafted: the equality above is speculative decoding's
  assert engine.free_slots() == [0, 1, 2]
  # Steps decoded only the active slots (gathered into the smallest row bucket, written back): 2 and 3 rows.
  assert engine.row_buckets == (2, 3)  # on CPU from two rows (a one-row step is slower there)
  assert {o.rows for o in outputs if o.entry is not None} == {2, 3}
  for o in outputs:
    active = sum(1 for t in o.tokens if t) if o.entry is not None else 0
    assert o.entry is None or o.rows >= active


def test_the_first_token_comes_from_the_insert(engine, prompts, greedy_refs):
  """Issue 39: insert returns the request's first token (no step runs); max_tokens 1 finishes there, its slot
  free; nothing compiles."""
  before = engine.compiled_programs()
  for prompt, ref in zip(prompts, greedy_refs):
    first = engine.insert(0, prompt, RequestSettings(MAX_NEW))
    assert first.tokens == ref[:1] and first.reason is None and engine.active_slots() == [0]
    engine.free(0)
  one = engine.insert(1, prompts[2], RequestSettings(1))
  assert one.tokens == greedy_refs[2][:1] and one.reason == "length" and engine.free_slots() == [0, 1, 2]
  assert engine.step().entry is None  # nothing left to decode
  assert engine.compiled_programs() == before


def test_a_freed_slot_never_leaks(engine, prompts, greedy_refs):
  """A short request in the slot a long one left (finished or freed) equals it alone."""
  long, short = prompts[3], prompts[4]
  for stop_after in (None, 4):
    first = Request(long, RequestSettings(MAX_NEW), stop_after=stop_after)
    second = Request(short, RequestSettings(MAX_NEW), arrive=1)
    drive(engine, [first])
    drive(engine, [second])
    assert second.slot == first.slot
    assert second.tokens == greedy_refs[4]


def test_a_step_of_fewer_rows_writes_back_only_the_cache_arrays_it_changes(engine):
  """A step decoding fewer rows than slots takes them from the slots and writes them back, but not the cache
  arrays the loop returns as it got them (found while tracing): T5's cross-attention keys and values and encoder
  mask, the target's and the draft's, stay where they are (writing them back unchanged cost a plain step 4-10 %);
  every array the loop changes is written back (the greedy tests above decode through such steps)."""
  keys = [k for k in engine.programs if k[2] < engine.slots]
  assert keys, engine.programs
  take, decode = slot_programs._take_rows, slot_programs._decode_rows  # pylint: disable=protected-access
  for key in keys:
    program, seen = engine._programs[key], []  # pylint: disable=protected-access

    def trace(state, program=program, seen=seen, rows=key[2]):
      if program.draft_outside:  # a plain step that leaves a lagging draft out (as step_program does)
        state = dataclasses.replace(state, draft_state=None)
      taken = take(program, state, jnp.arange(rows, dtype=jnp.int32))
      seen.append(decode(program, engine.target_params, engine.draft_params, taken, jnp.zeros((rows,), jnp.int32))[2])
      return taken.lengths

    jax.eval_shape(trace, engine._state)  # pylint: disable=protected-access
    unchanged = seen[-1]
    target = unchanged.target_cache
    assert target.cross_k and target.cross_v and target.encoder_mask, (key, target)
    assert not any(target.self_k) and not any(target.self_v) and not target.lengths, (key, target)
    drafts = [c for c in jax.tree.leaves(unchanged.draft_state, is_leaf=lambda x: isinstance(x, T5Cache))
              if isinstance(c, T5Cache)]
    assert len(drafts) == (0 if program.draft_outside else 1), (key, unchanged.draft_state)
    for cache in drafts:  # the draft's: its cross-attention arrays; its own keys change when it drafts
      assert cache.cross_k and cache.cross_v and cache.encoder_mask, (key, cache)
      assert engine.table.entries[key[0]].plain or not any(cache.self_k), (key, cache)
    assert not any([unchanged.sequences, unchanged.lengths, unchanged.done, unchanged.keys, unchanged.est_sum]), key
  # Under jax.disable_jit() a loop whose rows are all done never calls its body, so nothing is known unchanged and
  # every array is written back (the empty flags once failed: "Too few leaves for PyTreeDef").
  program, rows = engine._programs[keys[0]], keys[0][2]  # pylint: disable=protected-access
  with jax.disable_jit():
    state = engine._state  # pylint: disable=protected-access
    if program.draft_outside:
      state = dataclasses.replace(state, draft_state=None)
    taken = take(program, state, jnp.arange(rows, dtype=jnp.int32))
    taken = dataclasses.replace(taken, done=jnp.ones_like(taken.done))
    unchanged = decode(program, engine.target_params, engine.draft_params, taken, jnp.zeros((rows,), jnp.int32))[2]
  assert not any(jax.tree.leaves(unchanged)), unchanged


def test_a_step_of_fewer_rows_decodes_only_the_positions_its_tier_reaches(engine, prompts, greedy_refs):
  """A step of fewer rows than slots whose draft length needs less slack than the allocation's (gamma 2's: the
  plain tier and gamma 1 here) gathers and writes back only the self-attention positions its loop can reach, as
  a plain engine's caches hold (4 slack positions were 6 % of a plain step's cache at 16 rows: docs/serving.md);
  the widest tier, and a step of every slot, take them whole. Forced tiers alternating on 2 rows of 3 slots
  (each drafting step writes into the slack the next plain one leaves out) still give plain greedy tokens."""
  state, alloc = engine._state, engine._alloc.slack  # pylint: disable=protected-access
  full = state.target_cache.self_k[0].shape[2]  # [S, heads, C, kv]
  encoder = state.target_cache.cross_k.shape[3]
  for key in engine.programs:
    program = engine._programs[key]  # pylint: disable=protected-access
    rows, trim = key[2], alloc - program.settings.slack
    # a plain step that leaves a lagging draft out (as step_program does)
    given = dataclasses.replace(state, draft_state=None) if program.draft_outside else state
    taken = jax.eval_shape(lambda s, p=program, r=rows: slot_programs._take_rows(  # pylint: disable=protected-access
        p, s, jnp.arange(r, dtype=jnp.int32)).target_cache, given)
    want = full - trim if rows < engine.slots else full
    assert [k.shape[2] for k in taken.self_k + taken.self_v] == [want] * 2 * len(taken.self_k), (key, trim)
    assert taken.cross_k.shape[3] == encoder, key  # the encoder's positions are never cut
  assert any(alloc - engine._programs[k].settings.slack > 0 and k[2] < engine.slots  # pylint: disable=protected-access
             for k in engine.programs), engine.programs
  tokens = {}
  for slot, i in ((0, 1), (1, 3)):
    tokens[slot] = list(engine.insert(slot, prompts[i], RequestSettings(MAX_NEW)).tokens)
  tiers, running = [0, 2, 1, 2, 0, 0, 1], {0, 1}
  for n in range(200):
    if not running:
      break
    out = engine.step(program=(tiers[n % len(tiers)], "greedy", 2))
    for slot in sorted(running):
      tokens[slot] += out.tokens[slot]
      if out.finished[slot]:
        running.discard(slot)
  assert [tokens[0], tokens[1]] == [greedy_refs[1], greedy_refs[3]]


def test_plain_engine_and_a_tree_engine_equal_plain_greedy(pair, prompts, greedy_refs):
  for speculation in (None, jaxspec.Speculation(pair[1], gamma=2, tree=jaxspec.Tree(top_k=2, nodes=4))):
    e = SlotEngine(pair[0], speculation, slots=2, max_input_length=32, max_new_tokens=MAX_NEW,
                   iterations_per_step=3)
    requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(prompts[:4])]
    drive(e, requests)
    assert [r.tokens for r in requests] == greedy_refs[:4]


def test_seeded_sampling_is_the_same_alone_and_under_load(pair, prompts, greedy_refs):
  engine = SlotEngine(pair[0], jaxspec.Speculation(pair[1], gamma=3), slots=3, max_input_length=32,
                      max_new_tokens=MAX_NEW, iterations_per_step=2, budget=False,  # a fixed gamma at every step
                      modes=("sampled", "filtered"),  # greedy rows decode in the sampled programs
                      row_buckets=(3,))  # alone and under load in one row bucket: what the engine promises
  engine.warmup()
  before = engine.compiled_programs()
  sampled = RequestSettings(max_tokens=12, sampling=jaxspec.Sampling(1.0), seed=7)
  filtered = RequestSettings(max_tokens=12, sampling=jaxspec.Sampling(0.8, top_k=20, top_p=0.9), seed=3)
  alone = [drive(engine, [Request(prompts[1], s)])[0].tokens for s in (sampled, filtered)]
  load = [Request(prompts[0], RequestSettings(MAX_NEW)), Request(prompts[1], sampled, arrive=1),
          Request(prompts[3], RequestSettings(MAX_NEW, jaxspec.Sampling(0.5), seed=1)),
          Request(prompts[2], RequestSettings(MAX_NEW)), Request(prompts[1], filtered, arrive=2)]
  drive(engine, load)
  assert load[1].tokens == alone[0] and load[4].tokens == alone[1]
  # Greedy rows decoded by the sampled programs (one-hot p and q) keep their greedy tokens.
  assert load[0].tokens == greedy_refs[0] and load[3].tokens == greedy_refs[2]
  assert alone[0] != alone[1]
  assert engine.compiled_programs() == before  # sampled inserts and steps were compiled by warmup
  # The first token is drawn at insert as plain decoding draws it: plain generate's with a per-row seed (the same
  # key derivation, the same draw).
  want = generate_tokens(pair[0], prompts[1], 1, None, jaxspec.Sampling(temperature=1.0), seed=7)
  assert alone[0][:1] == want


def test_refusals(engine, prompts):
  with pytest.raises(SettingsError, match="max_tokens"):
    engine.insert(0, prompts[0], RequestSettings(max_tokens=MAX_NEW + 1))
  with pytest.raises(SettingsError, match="temperature"):
    RequestSettings(max_tokens=4, sampling=jaxspec.Sampling(-1.0))
  with pytest.raises(SettingsError, match="top_p"):
    RequestSettings(max_tokens=4, sampling=jaxspec.Sampling(top_p=0.0))
  with pytest.raises(SettingsError, match="seed"):
    RequestSettings(max_tokens=4, seed=-3)
  with pytest.raises(SettingsError, match="sampling must be a jaxspec.Sampling"):
    RequestSettings(4, 0.7)  # the sampling settings are one typed value
  with pytest.raises(InputError, match="max_input_length=32"):
    engine.insert(0, [5] * 33, RequestSettings(4))
  with pytest.raises(InputError, match="empty"):
    engine.insert(0, [], RequestSettings(4))
  with pytest.raises(InputError, match="outside"):
    engine.insert(0, [10**7], RequestSettings(4))
  with pytest.raises(SettingsError, match="slot"):
    engine.insert(3, prompts[0], RequestSettings(4))
  engine.insert(0, prompts[0], RequestSettings(4))
  with pytest.raises(SettingsError, match="busy"):
    engine.insert(0, prompts[0], RequestSettings(4))
  engine.free(0)
  assert engine.free_slots() == [0, 1, 2]
  with pytest.raises(SettingsError, match="schedule"):
    SlotEngine(engine.target, jaxspec.Speculation(engine.speculation.draft, gamma=2, schedule="heuristic"),
               slots=2, max_input_length=16, max_new_tokens=4)
  with pytest.raises(SettingsError, match="row_buckets"):
    SlotEngine(engine.target, None, slots=2, max_input_length=16, max_new_tokens=4, row_buckets=[0, 2])
  with pytest.raises(SettingsError, match="modes"):
    SlotEngine(engine.target, None, slots=2, max_input_length=16, max_new_tokens=4, modes=("beam",))
  greedy_only = SlotEngine(engine.target, None, slots=2, max_input_length=16, max_new_tokens=4, modes=("greedy",))
  assert greedy_only.row_buckets == (2,) and {k[1] for k in greedy_only.programs} == {"greedy"}
  with pytest.raises(SettingsError, match="needs 'sampled'"):
    greedy_only.insert(0, prompts[0][:16], RequestSettings(4, jaxspec.Sampling(1.0)))
  sampled_only = SlotEngine(engine.target, None, slots=4, max_input_length=16, max_new_tokens=4,
                            modes=("sampled",), row_buckets=(3,))
  assert sampled_only.programs == ((0, "sampled", 3), (0, "sampled", 4))  # greedy rows decode in it exactly
  with pytest.raises(SettingsError, match="needs 'filtered'"):
    sampled_only.insert(0, prompts[0][:16], RequestSettings(4, jaxspec.Sampling(1.0, top_k=5)))
