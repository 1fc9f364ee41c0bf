"""A fake clock for the slot engines of arms_in_process.py: every step charged from a budget's cost curves, not timed.

    curves = read_curves("docs/bench/serving/arms_ende_s69_amd_c1_c4.log")   # a budget's warm-up lines
    clock = ModelClock(curves)
    clock.install(engines.values())   # engine.py's STEP, WAKE and time, and each budget engine's curves
    clock.perf_counter()              # seconds of the steps charged so far

The engines decode for real (their tokens, their acceptance, the budget's estimates, plans, probes and learning
are the engine's own) while each step program's call advances this clock by what the curves say it costs:
c(R, k) of its row bucket R and draft length k (0: plain, a plain engine's too) times the share of the step's
iterations it ran, plus the catch-up c_catch(R) when a drafting step re-feeds a rested row, plus plain's settle
when a plain step follows a drafting one, plus the wakes (draft prefills) it was preceded by. Inserts and the
host's own work (the plan, the copy's bookkeeping) cost nothing. Each budget engine chooses by the same curves
(`install` sets them as its warm-up's), so what the budget learns from a step is the curve itself, and the arms'
ratios are what the choice rules give on this workload's acceptance at those costs, without this machine's timing
noise (a 2-core VM's speed moves by up to 2x within minutes) or the host's share of the step.
"""

from __future__ import annotations

import re
import types

import jax
import numpy as np

from jaxspec.serving import engine as engine_module
from jaxspec.serving.budget import CostCurves

MS = 1e-3


def read_curves(path: str) -> CostCurves:
  """The first budget's warm-up curves printed in a log (CostCurves.lines: 'rows R: k=0 34.14 ms, ..., catch-up
  0.00 ms, plain's settle 4.79 ms', then 'a request's draft prefill (wake) by prompt bucket: 16 1.58 ms, ...').
  ValueError when the log has none."""
  curves = CostCurves()
  with open(path, encoding="utf-8") as f:
    for line in f:
      rows = re.match(r"\s*rows (\d+): (.*)", line)
      if rows:
        r, rest = int(rows.group(1)), rows.group(2)
        if any(key[0] == r for key in curves.seconds):  # a later block (after serving, another arm): done
          break
        for k, ms in re.findall(r"k=(\d+) ([\d.]+) ms", rest):
          curves.seconds[(r, int(k))] = float(ms) * MS
        for name, target in (("catch-up", curves.catchup), ("plain's settle", curves.settle)):
          value = re.search(re.escape(name) + r" ([\d.]+) ms", rest)
          if value:
            target[r] = float(value.group(1)) * MS
      elif "draft prefill (wake)" in line and curves.seconds:
        curves.wake = {int(b): float(ms) * MS for b, ms in re.findall(r"(\d+) ([\d.]+) ms", line.split(":", 1)[1])}
        break
  if not curves.seconds:
    raise ValueError(f"{path}: no budget warm-up curves ('rows R: k=0 ... ms' lines) in it.")
  return curves


class ModelClock:
  """The fake clock (module docstring) over the engines `install` was given."""

  def __init__(self, curves: CostCurves):
    self.curves, self.now, self.pending = curves, 0.0, 0.0
    self._owners: dict[int, tuple] = {}  # id(step program) -> (engine, its key)
    self._last_k: dict[int, int] = {}  # id(engine) -> the draft length of its last step

  def perf_counter(self) -> float:
    return self.now

  def install(self, engines) -> None:
    """Charges the engines' steps and wakes on this clock (patching engine.py's STEP, WAKE and time) and gives
    every budget engine these curves as its warm-up's."""
    engines = list(engines)
    for engine in engines:
      for key, prog in engine._programs.items():  # pylint: disable=protected-access
        self._owners[id(prog)] = (engine, key)
      if engine.budget is not None:
        engine.costs = CostCurves(dict(self.curves.seconds), dict(self.curves.catchup), dict(self.curves.settle),
                                  dict(self.curves.wake))
    step, wake = engine_module.STEP, engine_module.WAKE

    def charged_step(prog, target_params, draft_params, state, stop, index, limits=None):
      engine, key = self._owners[id(prog)]
      args = (stop, index) if limits is None else (stop, index, limits)
      new, packed = step(prog, target_params, draft_params, state, *args)
      self._charge(engine, key, prog, np.asarray(jax.device_get(packed)), np.asarray(index), limits)
      return new, packed

    def charged_wake(alloc, layout, draft_params, state, slot, padded, length):
      self.pending += self.curves.wake.get(int(np.shape(padded)[-1]), 0.0)
      return wake(alloc, layout, draft_params, state, slot, padded, length)

    engine_module.STEP, engine_module.WAKE = charged_step, charged_wake
    engine_module.time = types.SimpleNamespace(perf_counter=self.perf_counter)

  def _charge(self, engine, key, prog, packed: np.ndarray, index: np.ndarray, limits) -> None:
    """Advances the clock by one step of `engine`'s program `key` (its packed rows [R, ...] back from the device)."""
    k, rows = engine.table.entries[key[0]].gamma, key[2]
    if (rows, k) not in self.curves.seconds:  # another --slots, --row_buckets or gamma than the log's
      raise ValueError(f"the cost model has no step cost at {rows} rows, draft length {k}: its log's engine ran "
                       f"other row buckets or tiers ({sorted(self.curves.seconds)}).")
    ran = int(packed[:, prog.width + 5].max(initial=0))
    seconds = self.curves.get(rows, k) * ran / engine.iterations_per_step + self.pending
    before = self._last_k.get(id(engine))
    if k > 0 and limits is not None:  # a drafting row rested longer than gamma: the re-feed (engine._behind)
      behind = engine._behind[index] & engine._active[index]  # pylint: disable=protected-access
      if np.any(behind & (np.asarray(limits) > 0)):
        seconds += self.curves.catchup.get(rows, 0.0)
    if k == 0 and before is not None and before > 0:
      seconds += self.curves.settle.get(rows, 0.0)
    self.now += seconds
    self.pending, self._last_k[id(engine)] = 0.0, k
