"""The verification budget's runs at each row bucket and its probes of the tiers it does not run (issue 39).

    runs = SideRuns(share=budget.probe)
    run = runs.ran(rows=8, k=0, seconds=0.012)             # after every step (warmup's too); k: its draft length
    run.learnt, run.levels                                  # True, None: the step's time is the machine's speed
    probe = runs.due(rows=8, choice=choice, crossing=0.02)  # the plan, when it chose afresh: a tier to probe, or None
                                                            # (crossing: seconds a probe of the other side pays once)
    runs.start(rows=8, choice=choice, probe=probe, home=current)   # its first step runs probe; then
    runs.probing(rows=8)                                    # the tier of the probe's later steps (None: no probe)

The budget weighs the tiers with step-cost curves whose ratios warmup measured (budget.py), and a served step
moves its bucket's curves together (the machine's speed), so the ratios between the tier the budget runs and the
others stay warm-up's: nothing of the others is served. On this project's 2-core VMs those ratios spread from one
warm-up to the next beyond what the choice turns on (docs/serving.md):
  - a gamma-4 step against a plain one at 4 rows read 2.0-3.2, where the choice at concurrency 4 turns on a sixth:
    the budget decoded plain where the fixed gamma 4 served 1.22x plain's tokens;
  - a gamma-4 step against a gamma-2 one at 1 and 4 rows read 1.46-1.48 in one engine and 1.18-1.26 in the engine
    beside it: the first drafted at gamma 2 where the fixed gamma 4 served 1.13x its tokens at concurrency 1.

So the other tiers are run now and then, at the same row bucket and in the same minute: a probe of `probe_steps`
steps of one tier (its settle after the switch is not learnt from, the step after it is: two steps of a drafting
tier, four of plain, whose step right after a drafting one reads 40 % dearer, the second 8-12 % and the third 3-4 %
on the embedded pair: budget.settle_steps). The candidates are the other side's best tier (drafting when plain decodes,
plain when drafting: `Choice.other`) and the running side's other tiers (`Choice.rivals`: the other drafting tiers
some row would draft in). The learnt step of a probe of a tier of the running side moves that tier's curve alone,
LEVEL_LEARN of the way to its time (`CostCurves.observe(levels=TIER)`): its level against the running tier's,
measured a step apart. The first learnt step of a side after a switch at its bucket (its settle run) from a run of
the other side longer than a probe (a probe's, or a switch the choice made) moves the curves of its side alone
(levels=SIDE): the two sides' levels. The return from a probe, and later steps of a run, move every curve of the
bucket (the speed), as before. A step's time at 16 rows spreads by a tenth and more on this project's VMs, so one
step's weight is a quarter: at a half (and the return from a probe moving its side too) the levels wandered enough
that the budget drafted at 54 of 176 steps at concurrency 16, where plain serves 1.18x the fixed gamma 4 (0.878 of
plain; docs/serving.md).

A candidate's probe is due at row bucket R when it last ran there (the other side: any of its tiers) longer ago
than its expected loss over its share of `share` (split evenly among the candidates), on that bucket's clock: the
seconds of the steps run at R (not the engine's idle time, nor its steps at other buckets: the drain of a load
at 64 rows through 32, 16, 8, ... rows found every smaller bucket's last probe far back on a clock of every
step, and probed there at once, each time; nor, in a benchmark that runs engines in turn, the others'):
loss = n_o (c_o - E_o c / E) + SWITCH (c + c_o) + X, the seconds its steps take beyond what the running tier would take
for their tokens by the choice's own scores (c, E: the chosen tier's cost and expected tokens; c_o, E_o the candidate's,
n_o its probe's steps), the switch there and back, and for a probe of the other side its crossing X, paid once
(SlotEngine._crossing): the catch-up at R (the rested drafts re-fed by a drafting probe's first step, when some have
rested, or by the return to drafting after a plain one) and, from plain, the wakes of the quiet rows (any drafting step
prefills their drafts). Without X the embedded pair's budget probed at 32 rows twice in eight
rounds, each probe waking up to 32 rows and re-feeding them, and drafted at 23 of its 199 steps there, where the
same budget without probes drafted at none of 236 and served 1.07x its tokens per second (docs/serving.md). A tier
far worse is probed seldom, one about as good every (n_o (c_o - c) + SWITCH (c + c_o)) n / share seconds
(n candidates; with the default share 2 % and one candidate about every 10 of its steps), and none that scores
more (the choice switches itself). Of several due, the longest overdue runs.
After a probe the next plan weighs Budget.stick against the tier before it: a probe of the other side takes over
only when it scores above that by the stick. As every plan's stick, it holds over about the same rows only
(SlotEngine.plan_step): when the probe's steps replaced more than a quarter of the rows the plan is fresh, as after
most drafting probes at 4 and 8 rows on the embedded pair, whose two gamma-4 steps give about a translation's tokens
(docs/serving.md, nineteenth session).

Exact in every case: a probe runs a compiled tier with limits from earlier verdicts, like any step.
"""

from __future__ import annotations

import dataclasses

from jaxspec.serving.budget import DRAFT_SETTLE, SIDE, TIER, Choice, settle_steps


def probe_steps(k: int) -> int:
  """A probe's steps of a tier of draft length k (0: plain): its settle after the switch (budget.settle_steps: 3 for
  plain, 1 for a drafting tier), then one learnt from."""
  return settle_steps(k) + 1


# What a switch costs beyond the steps' own times, as a share of the two tiers' steps (a step right after another
# program, docs/bench/serving/switch_cost.md: 7-13 %): a probe pays it going and coming back.
SWITCH = 0.1


@dataclasses.dataclass(frozen=True)
class Run:
  """The steps run in a row at one row bucket on one side (plain decoding, or drafting at any tier), the latest
  included; probe: whether the latest is a probe's (SIDE: of the other side's best tier; TIER: of another tier of
  the running side; None: not a probe's step), probe_step its place in the probe (1 the switch, `probe_steps` the
  learnt one)."""

  rows: int
  drafting: bool
  steps: int
  after_switch: bool  # the run follows one of the other side at the same row bucket
  before: int = 0  # the steps of the run it follows (0: none)
  probe: str | None = None
  probe_step: int = 0
  crossed: bool = False  # the run follows one of the other side (at any row bucket)

  @property
  def learnt(self) -> bool:
    """Whether the step's time may move the curves (the engine adds its own conditions): it follows a step of its
    side at its row bucket, past its side's settle when the run follows the other side (`budget.settle_steps`: a plain
    step is dearer for three steps after a drafting one), and is not a probe's first of another tier of the running
    side (which pays the switch to the probed tier)."""
    if self.probe == TIER:
      return self.steps >= 2 and self.probe_step > DRAFT_SETTLE
    return self.steps > (settle_steps(int(self.drafting)) if self.crossed else 1)

  @property
  def levels(self) -> str | None:
    """What the step's time moves beyond the machine's speed: TIER (the probed tier's curve alone) for the learnt
    step of a probe of the running side's other tier; SIDE (its side's curves alone) for the first learnt step of a
    side after a run of the other longer than a probe, whose curves follow the machine's speed now; None: the row
    bucket's curves together (the speed)."""
    if self.probe == TIER and self.probe_step == DRAFT_SETTLE + 1:
      return TIER
    other = int(not self.drafting)  # the side of the run before (a draft length of it: 0 plain, 1 drafting)
    if self.steps == settle_steps(int(self.drafting)) + 1 and self.after_switch and self.before > probe_steps(other):
      return SIDE
    return None


@dataclasses.dataclass
class Probe:
  """A probe in progress: `probe_steps(k)` steps of tier `tier` (draft length k) at row bucket `rows`; levels:
  what its learnt step moves (SIDE or TIER); ran: its steps run so far."""

  rows: int
  tier: int
  k: int
  levels: str
  ran: int = 0


@dataclasses.dataclass
class SideRuns:
  """Per row bucket, when each tier and each side last ran there (on the bucket's clock: the seconds of its steps so
  far); the current run; the probe in progress. share: Budget.probe."""

  share: float
  clocks: dict[int, float] = dataclasses.field(default_factory=dict)  # R -> the seconds of the steps at R
  seen: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)  # (R, k) -> its last step's end
  sides: dict[tuple[int, bool], float] = dataclasses.field(default_factory=dict)  # (R, drafting) -> the same
  first: dict[int, float] = dataclasses.field(default_factory=dict)  # R -> its first fresh plan (`due`)
  run: Run | None = None
  probe: Probe | None = None
  home: int | None = None  # the tier before the last probe, until the next fresh plan takes it (`current`)

  def ran(self, rows: int, k: int, seconds: float) -> Run:
    """Records a step of `seconds` at row bucket `rows` of draft length `k` (0: plain); returns the run it continues
    or starts. A probe whose tier this is not ends here."""
    drafting, probe, label, place = k > 0, self.probe, None, 0
    if probe is not None:
      if (probe.rows, probe.k) == (rows, k):
        probe.ran += 1
        label, place = probe.levels, probe.ran
      if probe.ran >= probe_steps(probe.k) or label is None:
        self.probe = None
    run = self.run
    if run is not None and (run.rows, run.drafting) == (rows, drafting):
      self.run = dataclasses.replace(run, steps=run.steps + 1, probe=label, probe_step=place)
    else:
      switched = run is not None and run.rows == rows
      self.run = Run(rows=rows, drafting=drafting, steps=1, after_switch=switched, before=run.steps if run else 0,
                     probe=label, probe_step=place, crossed=run is not None and run.drafting != drafting)
    now = self.clocks[rows] = self.clocks.get(rows, 0.0) + max(seconds, 0.0)
    self.seen[(rows, k)] = self.sides[(rows, drafting)] = now
    return self.run

  def probing(self, rows: int) -> int | None:
    """The tier of the probe's next step when a probe is under way at row bucket `rows` (None: none; a probe at
    another bucket is dropped)."""
    probe = self.probe
    if probe is None or probe.rows != rows:
      self.probe = None
      return None
    return probe.tier

  def current(self, last: int | None) -> int | None:
    """The tier a fresh plan weighs the stick against: the one before the last probe (taken once), else `last`
    (the previous step's)."""
    home, self.home = self.home, None
    return last if home is None else home

  def due(self, rows: int, choice: Choice, crossing: float = 0.0) -> Choice | None:
    """The candidate (`choice.other`, `choice.rivals`) whose probe is due at row bucket `rows` after a fresh plan
    chose `choice` (the longest overdue; None: none). A bucket's clocks start at its first plan. crossing: the
    seconds a probe of the other side pays once beyond its steps (SlotEngine._crossing: the catch-up, the quiet
    rows' wakes), added to its loss."""
    candidates = ([] if choice.other is None else [choice.other]) + list(choice.rivals)
    if not self.share or not candidates or choice.expected <= 0:
      return None
    now = self.clocks.get(rows, 0.0)
    start, share, best, most = self.first.setdefault(rows, now), self.share / len(candidates), None, 1.0
    for other in candidates:
      if other.expected <= 0:
        continue
      lost = other.cost - other.expected * choice.cost / choice.expected
      if lost <= 0:
        continue
      side = (other.k > 0) != (choice.k > 0)
      loss = probe_steps(other.k) * lost + SWITCH * (choice.cost + other.cost) + (crossing if side else 0.0)
      last = self.sides.get((rows, other.k > 0), start) if side else self.seen.get((rows, other.k), start)
      overdue = (now - last) * share / loss
      if overdue >= most:
        best, most = other, overdue
    return best

  def start(self, rows: int, choice: Choice, probe: Choice, home: int | None) -> None:
    """Starts a probe of `probe` (what `due` gave for `choice`) at row bucket `rows`, `home` the tier before it (the
    next fresh plan's `current`)."""
    levels = SIDE if (probe.k > 0) != (choice.k > 0) else TIER
    self.probe, self.home = Probe(rows=rows, tier=probe.tier, k=probe.k, levels=levels), home
