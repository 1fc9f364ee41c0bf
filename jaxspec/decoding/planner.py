"""One planner for every program the decoding loop runs: `generate` / `lower` (generation._prepare) and every step
and insert program of the slot engine (jaxspec/serving/engine.py, per table entry and sampling mode) turn a target,
its speculation (or None), a sampling mode and the lengths into the loop's static settings, the iteration's kind
and the drafter here, so that the checks and the rewrites are written once.

    source = planner.draft_source(target, speculation)       # the target / speculation checks, the drafter
    step = planner.plan(target, source.drafter, "greedy", max_new_tokens=64, gamma=4, tree=None)
    step.settings, step.kind                                  # loop.LoopSettings, loop.IterationKind

A tree of one child per node is the chain of its depth (the chain loop runs it); a plain step with a drafter
(`rests`: a slot engine's plain table entry over a speculation) runs the drafter's resting iteration (width-1
verify calls, `Drafter.idle`, gamma 1) so its state stays in sync; without one it is plain decoding (gamma 0).
"""

from __future__ import annotations

import dataclasses

from jaxspec.decoding.device import loop
from jaxspec.decoding.device.drafter import DraftSource, Drafter
from jaxspec.decoding.drafters import registry
from jaxspec.decoding.settings import MODES, Speculation, Tree
from jaxspec.errors import SettingsError
from jaxspec.models.loaded import Model

@dataclasses.dataclass(frozen=True)
class Plan:
  """One program's static settings (the drafter is settings.drafter) and the kind of its iterations (for `generate`
  the drafting iterations' kind: `loop.run` also rests when its schedule says so)."""

  settings: loop.LoopSettings
  kind: loop.IterationKind


def check_models(target, speculation) -> None:
  """SettingsError unless `target` is a jaxspec.Model and `speculation` a jaxspec.Speculation or None."""
  if not isinstance(target, Model):
    raise SettingsError(f"target must be a jaxspec.Model (from jaxspec.load), got {type(target).__name__}.")
  if speculation is not None and not isinstance(speculation, Speculation):
    raise SettingsError(f"speculation must be a jaxspec.Speculation or None, got {type(speculation).__name__}: "
                        f"wrap a draft as jaxspec.Speculation(draft, gamma=...).")


def draft_source(target: Model, speculation: Speculation | None) -> DraftSource:
  """The drafter `speculation` names for `target` and the params it reads (the registry's), after `check_models`."""
  check_models(target, speculation)
  return registry.draft_source(target, speculation)


def plan(target: Model, drafter: Drafter, mode: str, *, max_new_tokens: int, gamma: int, tree: Tree | None,
         plain: bool = False, rests: bool = False, schedule: str = "constant", stream: bool = False,
         fixed_width: bool = False) -> Plan:
  """The loop's static settings and iteration kind for `target` with `drafter` in sampling `mode` (`Sampling.mode`).

  gamma, tree: the draft length and tree shape (a speculation's, or a load table entry's); plain: no drafting (a
  plain table entry; gamma and tree are then ignored), resting `drafter` when `rests`; schedule, stream:
  `generate`'s (the slot engine runs "constant", unstreamed); fixed_width: a chain verifies gamma + 1 positions every
  iteration even with per-row limits (the slot engine's verification budget: some row drafts in the tier it chose,
  and a row drafting fewer is verified at that width exactly, without the variable path's per-iteration
  `lax.cond` on the width, which copies every cache leaf)."""
  if mode not in MODES:
    raise SettingsError(f"mode must be one of {MODES}, got {mode!r}.")
  if tree is not None and tree.top_k == 1:  # a tree of one child per node is the chain: the chain loop runs it
    gamma, tree = tree.nodes, None
  if plain:  # the drafter rests (`Drafter.idle`, width-1 verify calls) and keeps its state in sync
    gamma, tree = int(rests), None
  cfg = target.config
  settings = loop.LoopSettings(
      target=target.decoder(), drafter=drafter, gamma=gamma, max_new_tokens=int(max_new_tokens),
      greedy=mode == "greedy", filtering=mode == "filtered", eos_ids=tuple(cfg.eos_token_ids),
      pad_id=cfg.pad_token_id, schedule=schedule, streaming=stream, tree=tree)
  if plain:
    return Plan(settings, loop.IterationKind(rests=rests, width=1))
  fixed = not settings.variable or (fixed_width and tree is None)
  return Plan(settings, loop.IterationKind(rests=False, width=settings.gamma + 1 if fixed else None))
