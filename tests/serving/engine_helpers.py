"""Driving a SlotEngine in tests: requests join at given steps, take the first free slot, leave when finished
(or are freed early), and their tokens are collected per request; cost curves set by a test (`cost_curves`)."""

from __future__ import annotations

import dataclasses

import numpy as np

import jaxspec
from jaxspec.serving import RequestSettings, SlotEngine
from jaxspec.serving.budget import CostCurves


@dataclasses.dataclass
class Request:
  prompt: list[int]
  settings: RequestSettings
  arrive: int = 0  # the step before which it may be inserted (it waits for a free slot)
  stop_after: int | None = None  # free it (engine.free) once it has this many tokens (a client gone)
  slot: int | None = None
  tokens: list[int] = dataclasses.field(default_factory=list)
  reason: str | None = None
  slots_used: list[int] = dataclasses.field(default_factory=list)


def cost_curves(engine: SlotEngine, per_token: float) -> CostCurves:
  """The verification budget's step costs as a test sets them, not as warmup timed them (those follow the
  machine's load): c(R, k) = 1 + per_token * k at every row bucket R and tier k, no catch-up or wake charged."""
  return CostCurves({(r, e.gamma): 1.0 + per_token * e.gamma for r in engine.row_buckets
                     for e in engine.table.entries})


def drive(engine: SlotEngine, requests: list[Request], max_steps: int = 400, outputs: list | None = None
          ) -> list[Request]:
  """Runs every request to its end; returns them (tokens, reason and slot filled in). outputs: a list that
  collects every StepOutput."""
  pending = list(requests)
  running: dict[int, Request] = {}
  for step in range(max_steps):
    for r in [r for r in pending if r.arrive <= step]:
      free = engine.free_slots()
      if not free:
        break
      r.slot = free[0]
      r.slots_used.append(r.slot)
      first = engine.insert(r.slot, r.prompt, r.settings)
      r.tokens += first.tokens
      pending.remove(r)
      if first.finished:
        r.reason = first.reason
      else:
        running[r.slot] = r
    if not running and not pending:
      return requests
    out = engine.step()
    if outputs is not None:
      outputs.append(out)
    idle = [slot for slot in range(engine.slots) if slot not in running]
    for slot, r in list(running.items()):
      r.tokens += out.tokens[slot]
      if out.finished[slot]:
        r.reason = out.reasons[slot]
        del running[slot]
      elif r.stop_after is not None and len(r.tokens) >= r.stop_after:
        engine.free(slot)
        r.reason = "freed"
        del running[slot]
    for slot in idle:
      assert out.tokens[slot] == [] and not out.finished[slot], f"idle slot {slot} emitted {out.tokens[slot]}"
  raise AssertionError(f"requests still running after {max_steps} steps")


def generate_tokens(target, prompt, max_tokens: int, speculation=None, sampling=None, seed=None) -> list[int]:
  """`jaxspec.generate`'s tokens for one prompt alone (EOS included, nothing after)."""
  kwargs = {} if seed is None else {"seed": [seed]}
  out = jaxspec.generate(target, [prompt], speculation, sampling, max_new_tokens=max_tokens,
                         max_input_length=max(64, len(prompt)), **kwargs)
  return np.asarray(out.tokens[0, :out.lengths[0]]).tolist()
