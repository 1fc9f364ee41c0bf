"""The verification budget's runs of each side and its probes of the side it does not run (issue 39).

    runs = SideRuns(share=budget.probe)
    run = runs.ran(rows=8, drafting=False, now=time.perf_counter())   # after every step (warmup's too)
    run.steps, run.after_switch                                        # 3, False: learn the machine's speed
    if runs.due(rows=8, choice=choice, now=...):                       # the plan, when it chose afresh
      choice = runs.start(choice)                                      # the other side's best, for PROBE_STEPS

The budget weighs plain decoding against drafting with step-cost curves whose ratios warmup measured (budget.py).
On this project's 2-core VMs warmup's ratio of a gamma-4 step to a plain one at 4 rows read 2.0-3.2 from one
warmup to the next, where served steps in one process read 2.5 (docs/serving.md), and the choice at concurrency 4
turns on a sixth: the budget decoded plain where the fixed gamma 4 served 1.22x plain's tokens. A served step
moves its bucket's curves together (the machine's speed), so the side the budget runs cannot correct the other's
level: nothing of the other side is served, and its rows' acceptance estimates rest at the prior.

So, the other side is run now and then, at the same row bucket and in the same minute: a probe of PROBE_STEPS steps
of its best tier (the first pays the switch and is not learnt from; the second is). The first learnt step of a
side after a switch at its bucket from a run of the other side longer than a probe (a probe's, or a switch the
choice made: `Run.levels_side`) moves the curves of its side alone, SIDE_LEARN of the way to its time
(`CostCurves.observe(side=True)`): the two sides' levels, one against the other, measured a step apart. The
return from a probe, and later steps of a run, move every curve of the bucket (the speed), as before. A step's
time at 16 rows spreads by a tenth and more on this project's VMs, so one step's weight is a quarter: at a half
(and the return from a probe moving its side too) the levels wandered enough that the budget drafted at 54 of
176 steps at concurrency 16, where plain serves 1.18x the fixed gamma 4 (0.878 of plain; docs/serving.md).

A probe is due at row bucket R when the other side last ran there longer ago than its expected loss over
`share`: loss = PROBE_STEPS (c_o - E_o c / E) + SWITCH (c + c_o), the seconds its steps take beyond what the
running side would take for their tokens by the choice's own scores (c, E: the chosen tier's cost and expected
tokens; c_o, E_o the other side's best), and the switch there and back. A side far worse is probed seldom, one
about as good every (PROBE_STEPS (c_o - c) + SWITCH (c + c_o)) / share seconds (with the default share 2 %, about
every 10 of its steps), and none at all that scores more (the choice switches itself).
After a probe the next plan weighs Budget.stick against the tier before it: the probe's side takes over only
when it scores above that by the stick.

Exact in every case: a probe runs a compiled tier with limits from earlier verdicts, like any step.
"""

from __future__ import annotations

import dataclasses

from jaxspec.serving.budget import Choice

PROBE_STEPS = 2  # a probe's steps: the switch, then one learnt from
# What a switch costs beyond the steps' own times, as a share of the two sides' steps (a step right after another
# program, docs/bench/serving/switch_cost.md: 7-13 %): a probe pays it going and coming back.
SWITCH = 0.1
PROBE_HOLD = 1e9  # the stick a probe's later steps plan with: its side's best tier, whatever the other side scores


@dataclasses.dataclass(frozen=True)
class Run:
  """The steps run in a row at one row bucket on one side, the latest included."""

  rows: int
  drafting: bool
  steps: int
  after_switch: bool  # the run follows one of the other side at the same row bucket
  before: int = 0  # the steps of the run it follows (0: none)

  @property
  def levels_side(self) -> bool:
    """Whether this step is the first learnt one of a side after a run of the other longer than a probe (whose
    curves follow the machine's speed now): its time sets its side's level against the other's."""
    return self.steps == 2 and self.after_switch and self.before > PROBE_STEPS


@dataclasses.dataclass
class SideRuns:
  """Per row bucket, when each side last ran; the current run; the probe in progress. share: Budget.probe."""

  share: float
  seen: dict[tuple[int, bool], float] = dataclasses.field(default_factory=dict)  # (R, drafting) -> its last step
  run: Run | None = None
  probing: int = 0  # the probe's steps still to plan after its first
  tier: int | None = None  # the probed tier (its side's best at the probe's first step)
  home: int | None = None  # the tier before the probe: the next plan after it weighs the stick against it

  def ran(self, rows: int, drafting: bool, now: float) -> Run:
    """Records a step at row bucket `rows` on its side; returns the run it continues or starts."""
    run = self.run
    if run is not None and (run.rows, run.drafting) == (rows, drafting):
      self.run = dataclasses.replace(run, steps=run.steps + 1)
    else:
      switched = run is not None and run.rows == rows
      self.run = Run(rows=rows, drafting=drafting, steps=1, after_switch=switched, before=run.steps if run else 0)
    self.seen[(rows, drafting)] = now
    return self.run

  def due(self, rows: int, choice: Choice, now: float) -> bool:
    """Whether a fresh plan's `choice` at row bucket `rows` should give way to a probe of its `other` side."""
    other = choice.other
    if not self.share or other is None or choice.expected <= 0 or other.expected <= 0:
      return False
    lost = other.cost - other.expected * choice.cost / choice.expected
    if lost <= 0:
      return False
    loss = PROBE_STEPS * lost + SWITCH * (choice.cost + other.cost)
    last = self.seen.setdefault((rows, other.k > 0), now)
    return now - last >= loss / self.share

  def start(self, choice: Choice, current: int | None) -> Choice:
    """Starts a probe of `choice`'s other side (`due`), `current` the tier before it; returns the probe's first
    step's choice."""
    self.probing, self.tier, self.home = PROBE_STEPS - 1, choice.other.tier, current
    return choice.other
