"""Nothing allocated that cannot fit: before allocating, the slot engine checks slots x (prompt bucket +
max_new_tokens + the widest step's slack) for the target, the drafter and the table's widest entry against a
device's free memory (`memory_guard.check_slots`); what does not fit is one CacheTooLargeError naming --slots and
the most slots that fit at these lengths, and `launch/serve.py` ends with that line (no traceback, exit 1). The
device's free memory is set here by replacing `memory_guard._least_free` (as tests/decoding/test_memory_guard.py
does); the script test asks for more than any machine has. Per device on a mesh: tests/serving/
test_slot_engine_mesh.py."""

from __future__ import annotations

import re
import subprocess
import sys

import jaxspec
import pytest

from jaxspec.decoding import memory_guard
from jaxspec.errors import CacheTooLargeError
from jaxspec.serving import SlotEngine

from script_helpers import ROOT, assert_one_line_error, compile_env, script_env
from test_slot_engine_drafters import TABLE, _llama

KW = dict(max_input_length=32, max_new_tokens=24, iterations_per_step=2, modes=("greedy", "sampled"))


@pytest.fixture(scope="module")
def models():
  return _llama(0), _llama(0, mix=0.07)


def _need(monkeypatch, target, speculation, slots, **kw) -> int:
  """What the check computes for an engine (bytes per device), on a device it always fits."""
  seen = []
  real = memory_guard.slots_need
  monkeypatch.setattr(memory_guard, "_least_free", lambda where: 2**50)
  monkeypatch.setattr(memory_guard, "slots_need", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
  SlotEngine(target, speculation, slots=slots, **{**KW, **kw})
  monkeypatch.setattr(memory_guard, "slots_need", real)
  return seen[0]


def test_slots_that_do_not_fit_are_refused_before_allocating(monkeypatch, models):
  target, draft = models
  spec = jaxspec.Speculation(draft, gamma=2)
  need = _need(monkeypatch, target, spec, 8)
  assert need > 8 * 32 * 4  # at least the slots' token buffers; the caches are far more
  monkeypatch.setattr(memory_guard, "_least_free", lambda where: int(need / 0.9) + 1)
  SlotEngine(target, spec, slots=8, **KW)  # fits
  allocated = []
  monkeypatch.setattr(SlotEngine, "_allocate", lambda self: allocated.append(1))
  with pytest.raises(CacheTooLargeError) as refused:
    SlotEngine(target, spec, slots=16, **KW)
  message = str(refused.value)
  assert re.fullmatch(r"--slots=16 needs [\d.]+ GiB per device for the slots' caches, state and a step \(32 input "
                      r"positions \+ 27 per slot, mesh data=1 x model=1\) but a device has [\d.]+ GiB free: at most 8 "
                      r"slots fit at these lengths\.", message), message
  assert not allocated  # refused before anything was allocated


def test_the_drafter_and_the_tables_widest_entry_are_counted(monkeypatch, models):
  """Plain decoding needs less than a draft model's chain, which needs less than a table with a wider chain and a
  tree: a budget between them admits the one and refuses the other."""
  target, draft = models
  plain = _need(monkeypatch, target, None, 4)
  chain = _need(monkeypatch, target, jaxspec.Speculation(draft, gamma=2), 4)
  table = _need(monkeypatch, target, jaxspec.Speculation(draft, gamma=2), 4, table=TABLE)
  assert plain < chain < table, (plain, chain, table)
  for low, high, fits, refused in ((plain, chain, dict(speculation=None), dict()),
                                   (chain, table, dict(), dict(table=TABLE))):
    monkeypatch.setattr(memory_guard, "_least_free", lambda where, b=(low + high) / 2: int(b / 0.9))
    SlotEngine(target, fits.get("speculation", jaxspec.Speculation(draft, gamma=2)), slots=4, **KW)
    with pytest.raises(CacheTooLargeError, match=r"^--slots=4 needs .* at most [0-3] slots? fit|not even one"):
      SlotEngine(target, jaxspec.Speculation(draft, gamma=2), slots=4, **{**KW, **refused})


def test_serve_script_refuses_slots_that_cannot_fit_in_one_line():
  """launch/serve.py with slots that no machine holds at these lengths, and a data axis that does not divide
  --slots (2 simulated devices): each one line on stderr, exit 1, before anything is served."""
  runs = [(["--slots=64", "--max_new_tokens=100000000"], {}, ("--slots=64 needs", "not even one slot fits")),
          (["--slots=3", "--mesh=data:2"], {"XLA_FLAGS": compile_env()["XLA_FLAGS"] +
                                            " --xla_force_host_platform_device_count=2"},
           ("--slots=3 is not a multiple of the mesh's data axis (2)",))]
  for args, env, needles in runs:
    res = subprocess.run([sys.executable, "launch/serve.py", "--port=0", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env=script_env(**env))
    assert_one_line_error(res, *needles)
    assert len([line for line in res.stderr.splitlines() if line.startswith("error:")]) == 1, res.stderr[-2000:]
