"""The slot engine on a mesh of 4 simulated CPU devices (one subprocess for the module: the device count is fixed
before JAX starts). The slots are split over the mesh as `generate` splits its batch: rows over `data`, the draft
model's cache rows over `data` too. Checked: each device holds a quarter of the slot state with data:4 (the
arrays' shardings and their addressable shards' sizes); inserts and steps (also a step gathering fewer rows than
slots) leave every donated array where it was allocated, and their compiled programs move no rows between devices
(no all-gather but the step's small packed output; the engine runs the verification budget, the default, whose
per-slot estimates are split by rows too); greedy tokens equal `generate`'s on one device; a `data` size that does
not divide the slots is one error naming --slots; the memory check counts per device (4x the slots fit on data:4
that fit one device). (data:2 x model:2, the target's KV heads over `model`, with a load-adaptive table:
test_slot_engine_hosts.py, over two processes.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from script_helpers import compile_env, script_env

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = r"""
import json, re
import jax, jaxspec, numpy as np
from jaxspec.decoding import memory_guard, slot_programs
from jaxspec.errors import CacheTooLargeError, SettingsError
from jaxspec.serving import Budget, RequestSettings, SlotEngine
from jaxspec.serving import engine as slot_engine
from test_slot_engine_drafters import MAX_NEW, PROMPTS, _llama
from engine_helpers import Request, drive, generate_tokens
assert len(jax.devices()) == 4
out = {}
target, draft = _llama(0), _llama(0, mix=0.07)
spec = jaxspec.Speculation(draft, gamma=2)
kw = dict(max_input_length=32, max_new_tokens=MAX_NEW, iterations_per_step=3, modes=("greedy",))
refs = [generate_tokens(target, p, MAX_NEW) for p in PROMPTS]


def per_device(engine):
  # The most bytes of the slot state one device holds (its addressable shards), and every leaf's spec.
  held = {}
  for x in jax.tree_util.tree_leaves(engine._state):
    for shard in x.addressable_shards:
      held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
  return max(held.values())


def placed(engine):
  return [(str(x.sharding.spec), x.shape) for x in jax.tree_util.tree_leaves(engine._state)]


def run(engine, prompts):
  requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(prompts)]
  rows = []
  outputs = []
  drive(engine, requests, outputs=outputs)
  return [r.tokens for r in requests], sorted({o.rows for o in outputs if o.rows is not None})


# data:4: a quarter per device; the state stays where it was allocated; no rows cross devices.
budget = Budget(tiers=(0,))  # the verification budget (the default) over two tiers: plain and gamma 2
one = SlotEngine(target, spec, slots=8, budget=budget, **kw)
quarter = SlotEngine(target, spec, slots=8, mesh=jaxspec.make_mesh(data=4, model=1), budget=budget, **kw)
out["bytes"] = [per_device(one), per_device(quarter)]
out["specs"] = sorted({s for s, _ in placed(quarter)})
before = placed(quarter)
tokens, rows = run(quarter, PROMPTS)
out["data4_equal"] = [t == r for t, r in zip(tokens, refs)]
out["data4_rows"] = rows
out["data4_kept"] = placed(quarter) == before
padded = np.zeros((1, 16), np.int32)
insert = slot_programs.INSERT.lower(quarter._first["greedy"], quarter._layout, quarter.target_params, quarter.draft_params,
                                    quarter._state, np.int32(1), padded, np.asarray([3], np.int32), np.uint32(0),
                                    np.float32(0), np.int32(0), np.float32(1), np.int32(5), np.bool_(False),
                                    np.int32(0), quarter.acceptance.alpha).compile().as_text()

def gathered(text):  # the result types of a compiled program's all-gathers, layouts dropped
  return [re.sub(r"\{.*", "", t) for t in re.findall(r"= (\S+) all-gather\(", text)]


out["insert_gathers"] = gathered(insert)
# A step's only all-gather: its packed tokens, counts and acceptance estimates [R, W + 6 + 2G] int32 (a plain
# tier's without the estimates: [R, W + 6]), replicated for every process to read. The engine runs the
# verification budget (its default): per-row limits go in too, but for a plain tier's program, which takes none
# (and leaves the lagging draft's state out: without_draft).
G = quarter.estimates().shape[1]
out["step_gathers"] = [[g for g in gathered(slot_programs.STEP.lower(p, quarter.target_params, quarter.draft_params,
                                                                   slot_programs.without_draft(quarter._state)[0]
                                                                   if p.draft_outside else quarter._state,
                                                                   np.zeros(8, bool),
                                                                   quarter._rows(p.rows),
                                                                   *(() if quarter.table.entries[k[0]].plain else
                                                                     (np.full(p.rows, p.settings.gamma, np.int32),))
                                                                   ).compile().as_text())
                        if g != f"s32[{p.rows},{p.width + 6 + 2 * G * p.estimates}]"]
                       for k, p in quarter._programs.items()]
out["step_programs"] = len(quarter._programs)
out["programs_rows"] = sorted({p.rows for p in quarter._programs.values()})

# A data size that does not divide the slots.
try:
  SlotEngine(target, spec, slots=6, mesh=jaxspec.make_mesh(data=4, model=1), **kw)
  out["divides"] = None
except SettingsError as e:
  out["divides"] = [str(e), isinstance(e, ValueError)]

# The memory check per device: a budget that holds 8 slots on one device holds about 32 on data:4.
width = slot_engine._buckets(32)[-1]
settings = [p.settings for p in one._programs.values()]
need = memory_guard.slots_need(settings, None, target, one._source, 8, width, 4)
memory_guard._least_free = lambda where: int(need / 0.9) + 1
most = []
for mesh in (None, jaxspec.make_mesh(data=4, model=1)):
  try:
    SlotEngine(target, spec, slots=64, mesh=mesh, **kw)
  except CacheTooLargeError as e:
    most.append(int(re.search(r"at most (\d+) slots fit", str(e)).group(1)))
out["most"] = most
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def facts():
  env = script_env(PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
                   XLA_FLAGS=compile_env()["XLA_FLAGS"] + " --xla_force_host_platform_device_count=4")
  run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, env=env, cwd=HERE)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_each_device_holds_a_quarter_of_the_slots_on_data_4(facts):
  single, quarter = facts["bytes"]
  assert quarter * 4 == single, facts["bytes"]  # every array of the state is split by rows
  assert facts["specs"] == ["P('data',)"], facts["specs"]


@pytest.mark.slow
def test_inserts_and_steps_keep_the_slots_split_and_move_no_rows(facts):
  assert facts["data4_kept"]
  assert facts["programs_rows"] == [4, 8] and 4 in facts["data4_rows"], facts  # a step gathered 4 of 8 slots
  assert facts["insert_gathers"] == [] and facts["step_gathers"] == [[]] * facts["step_programs"], facts  # no rows


@pytest.mark.slow
def test_greedy_tokens_on_a_mesh_equal_one_device(facts):
  assert facts["data4_equal"] == [True] * 6, facts  # (data:2 x model:2 with a table: test_slot_engine_hosts.py)


@pytest.mark.slow
def test_a_data_axis_that_does_not_divide_the_slots_is_one_error(facts):
  message, is_value_error = facts["divides"]
  assert is_value_error and message.startswith("--slots=6 is not a multiple of the mesh's data axis (4)")
  assert "\n" not in message


@pytest.mark.slow
def test_the_memory_check_counts_per_device_on_a_mesh(facts):
  one, quarter = facts["most"]
  assert one == 8 and quarter % 4 == 0 and quarter >= 28, facts["most"]
