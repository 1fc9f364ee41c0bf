"""The verification budget: the slot engine's default speculation with a drafter and no load table (issue 39).

    budget = Budget()                                   # the settings (SlotEngine(..., budget=budget))
    tiers = budget.tiers_for(gamma=4)                   # (0, 1, 2, 4): the compiled draft lengths (0: plain)
    costs = CostCurves({(8, 0): 0.010, (8, 4): 0.018, ...})   # c(R, k): seconds of one step, measured in warmup
    choice = choose(alpha, tiers, [costs.get(8, k) for k in tiers], budget.theta)
    choice.tier, choice.limits                          # the tier to run and each row's draft limit

Each step the engine runs one compiled program of a bounded set of tiers (draft lengths k: by default 0, 1, 2, 4
and the speculation's gamma, those <= gamma; plain decoding is k = 0, the drafter resting), with a per-row limit
on the draft length inside it (the variable-length path `generate`'s adaptive schedules use: `Drafter.propose`'s
`limit`). The choice is the host's (over several processes process 0's, which every process runs: hosts.py),
from the previous step's per-row, per-position acceptance estimates (decoding/device/estimates.py, which the
step's one packed copy brings back) and from the step-cost curves c(R, k) timed in warmup:

  - per row b its survival s(b, j) = a(b, 1) ... a(b, j) (the probability that its j-th draft is accepted);
  - per tier k each row's limit k_b = the largest j <= k with s(b, j) >= theta (0: it drafts nothing);
  - the expected tokens of the step E(k) = sum_b min(left_b, I (1 + s(b, 1) + ... + s(b, k_b))): I the step's
    iterations, left_b the tokens row b may still give (its max_tokens less those it gave). A row that ends
    within the step gives nothing for the rest of it, so a wide tier, whose rows end sooner, is charged for the
    iterations it would spend on a finished row (without the cap the embedded pair drafted at 32 rows, where its
    steps gave no more tokens per second than plain ones: 1.71 against 1.78 tokens/ms); and when every row ends
    within the step the loop stops early, so its cost is taken for the iterations expected to run,
    max_b ceil(left_b / e_b) of the I (e_b: row b's expected tokens an iteration);
  - a row may end before its max_tokens (EOS, a stop string): E counts within(T, h) = (1 - (1 - h)^T) / h of the
    T = I (1 + s(b, 1) + ...) tokens it would give, h the served requests' chance of ending after a token
    (`EndRate`: decayed counts over the finished requests; 0 for a request that ignores EOS). Translations of
    about 27 tokens (the embedded pair's workload) lose a quarter of a gamma-4 step's 13.8 tokens this way against
    6 % of a plain step's 4: the cap on max_tokens alone left the budget drafting at 16 rows, where plain steps
    gave 1.92 tokens/ms against its 1.59. Once EndRate.SAMPLES requests have finished (Budget.lengths, the
    default), the tokens a row has left before an early end are drawn from the served requests' lengths given
    the tokens it gave (`EndRate.remaining`, `within_lengths`) in place of that one hazard a token: a translation's
    length is about set by its source, so a row 5 tokens into 27-token translations gives all of a 16-token step,
    where the hazard took a quarter of it and kept the budget plain at 16 rows after plain steps, with the fixed
    gamma 4 1.16x plain on the same fake clock (twenty-ninth session, docs/serving.md). Such an end stops the
    loop too when no other row decodes on, so the iterations expected to run count it: 1 - prod_b (1 - [i < n_b]
    (1 - h_b)^(i e_b)) at iteration i, n_b = ceil(left_b / e_b) (`_per_row`). Without it a request alone was
    charged a gamma-4 step's 4 iterations where 0.83 of them are expected to run (h = 1/27, 3.5 tokens an
    iteration) against 0.95 of a plain step's; at c=1 that budget ran plain and gamma-2 steps where the fixed
    gamma 4 was 1.27x plain (tau 2.93 against 3.44);
  - a row's estimates are carried to its request's age (Budget.ages, the default; ages.py): acceptance grows
    with a request's age (0.41 of a translation's first step's drafts accepted, 0.71-0.93 of the next ones'), so
    estimates learnt at a request's first step, and a prior pooled from such steps, read its later steps low;
  - the tier maximising E(k) / c'(R, k) (ties: the shorter), R the step's row bucket, c'(R, 0) = c(R, 0) and
    c'(R, k) = (1 + margin) c(R, k) for a drafting tier (margin 0 by default), plus, when one of its drafting
    rows rested longer than gamma (plain steps since it last drafted), the catch-up warmup timed at R (a re-feed
    of the drafts from position 0: 65 ms beside a 156 ms drafting step at 64 rows on the embedded pair) spread
    over the drafting steps expected to follow. Without it the budget went back and forth between plain and
    drafting at 16 and 32 rows, paying a re-feed at each return. After a plain step, plain's settle at R is spread
    the same way (CostCurves.settle, warmup's: the first `settle_steps(0)` plain steps after a drafting one cost
    more than steady ones, 2.7 and 5.5 ms at 4 and 8 rows in one warm-up on the embedded pair, after gamma 1; 7-9 ms
    after gamma 4), the return a run of drafting from plain ends in;
  - a draft model's prefill waits for a request's first drafting step (the wake, served_draft.py), so drafting
    pays it once per request, and in a steady state where every new request is woken that is w_b / L_b per token
    (w_b the prefill timed in warmup at the row's prompt bucket, L_b the request's expected length: the tokens it
    gave and those `within` its tokens left): a drafting tier's cost is raised by sum_b (w_b / L_b) E(k, b). A row
    not woken yet pays its wake at the next drafting step for the tokens it has left alone, so its L_b is those
    (SlotEngine._prefill_per_token): a switch to drafting halfway through the rows' requests pays twice the steady
    state's share.
    Without it the Qwen pair drafted at 8 rows (19 of 27 steps, in one process) where a fixed gamma 4 was 0.92x
    plain: its 0.5B draft's prefill of a chat prompt is a large share of a request's drafting.

The curves are warmup's, then moved by the steps served (Budget.learn, 0.1): each step the plan chose that ran all
its iterations, re-fed no rested draft and followed a step of the same row bucket and side (plain after plain,
drafting after drafting at any tier) moves its row bucket's curves, every tier's and the catch-up, by the same
factor, a tenth of the way from its c(R, k) to its time (`CostCurves.observe`). They follow the machine's speed
(on this project's 2-core VMs a step's time moves up to 2x within minutes, and served steps share the cores with
the HTTP work) while the ratios between tiers, which the choice weighs at R, stay warm-up's interleaved ones.
Until the thirteenth session a step moved its own tier's curve alone: the tiers the budget ran then followed the
machine and the others kept warm-up's speed, so when the machine sped up while it ran one side, that side looked
cheaper than warm-up measured it and the budget stayed there (a likely part of why, on the embedded pair at c=8,
it drafted at 133 of 230 steps in one process and 3 of 258 in another, where served plain steps gave 1.21x the
tokens per second of gamma-4 ones: docs/serving.md). Served against warm-up's interleaved curves a tier's step
cost 0.995-1.10 times its curve (docs/bench/serving/served_vs_model_c8.md), so the ratios need no per-tier
correction there. A step right after a switch between plain and drafting is not learnt from: it pays for the
streaming of the previous step's tokens, which after a wide step made plain look 40 % dearer. The sides' levels,
one against the other, and the tiers' within a side are warm-up's until a switch or a probe: the first learnt step
of a side after a switch (past its settle: `settle_steps`, plain's fourth) moves its side's curves alone (LEVEL_LEARN),
and the tiers not run are probed now and then, two steps of a drafting tier or four of plain at a cost
Budget.probe bounds, the last moving its side's curves (the other side's best tier) or its own (another tier of the
running side) alone (probes.py): warm-up's ratio of a gamma-4 step to a plain
one at 4 rows read 2.0-3.2 from one warm-up to the next on the embedded pair, where the choice at concurrency 4
turns on a sixth, and of a gamma-4 step to a gamma-2 one at 1 row 1.18-1.48.
Between plain decoding and drafting, the previous step's side is kept unless the other's best tier scores more
than Budget.stick (0.1) above it: such a switch costs what no score counts (wakes, that streaming), and estimates
that move a little flipped the choice back and forth. It holds over about the same rows only (the engine passes
no `current` when more than a quarter of the rows are new or ended since the previous step: `same_rows`): at
concurrency 1 each new request, at the prior's estimates (0.8 a position, where a gamma-4 step scored within
the stick of a plain one), otherwise started on the side of the request before, and the budget decoded plain at 1186
of 2175 steps where the fixed gamma 4 served 1.06x plain. A new request's estimates start at the served requests'
acceptance (AcceptancePrior, from 0.8 a position): a request alone starts where those before it ended. Budget.idle
(0 by default) counts a finished row's slot as empty for that share of the next step when no request waits (the next
one arrives during it and is inserted after it): 0.5 and 1 made the budget decode plain at concurrency 4, where a
fixed gamma 4 was 1.1-1.2x plain (docs/serving.md). A request alone that has verified nothing and whose choice
is plain drafts one step instead where the last served requests say it pays (their acceptance and lengths:
lookahead.py, twenty-fourth session).

The margin (Budget.margin, 0 by default, --budget_margin) raises a drafting tier's cost by a share: a hedge for
what a step's own ratio leaves out (a longer step keeps the slots of the requests that end in it empty until it
ends). Measured on this project's CPU with the embedded pair in one run (docs/bench/serving/margins.md), 0.2 gave
more tokens per second than 0 at one concurrency of six (32: 1279 against 1236) and fewer or as many at the
others, so the default is 0.

The plan is the host's, between two steps' device work, where it holds every row: a fresh `choose` cost 0.35 ms
a step here (numpy calls of a few microseconds each), up to 1.7 % of a step at 8 rows on the embedded pair. So a
step of at least Budget.ahead (8) active rows has the next step's tier chosen while it runs on the device
(`Ahead`, SlotEngine._plan_ahead: over the rows expected to decode on after it, each less its expected tokens of
the step, from the estimates before it), and the next plan takes that tier with each row's limit from the
estimates then (`tier_limits`; none for a plain tier) when the rows are about the same (the row bucket, at most a
quarter new, at most a quarter ended: `same_rows`), else chooses afresh: 0.06 against 0.34 ms a plan measured
alone, 0.21-0.22 against 0.71-0.78 ms in the decode loop at 8-32 rows (docs/bench/serving/plan_cost_ahead.md).
Its estimates are a step older: with fewer rows, where each request's own acceptance moves the choice and its few
steps each count (the embedded pair's translations last 2-3 steps at c=1), the plan stays fresh between steps.

A fresh plan that chooses plain stands for the next Budget.hold (4) plans as well, at its row bucket over about the
same rows (`Ahead.holds`), which then choose nothing (nor plan ahead); so does a plain tier chosen ahead (since the
twenty-seventh session: before, once a hold ran out, from Budget.ahead rows a plan was made ahead at nearly every
step, 57 of 88 at 16 rows, on two cores beside the step's own device work). Until the twenty-second session a request
alone was planned afresh (held at 1 row too, the budget decoded plain at 1526 steps of 2382 at c=1, afresh at 1133
of 2111, for the same tokens per second); on the default row buckets of a CPU (from 2) its fresh plans cost the held
budget 0.49 ms a step of 11.5 at c=1 against 0.22 held (docs/bench/serving/plain_split.log). Holding loses little:
in a plain step no draft is verified, so the rows' estimates move only by their relaxation toward the prior, and the
choice with them by a few per cent a step, against the stick's tenth a switch to drafting needs over about the same
rows. On this project's 2-core VMs the host's work right after a step runs 2-3x slower than alone (0.15 ms for a
plan alone, 0.55 ms after 20 ms of sleep, 0.6-0.7 ms in the decode loop at 4 rows: the device's work, on the same
cores, has left the caches cold), and the budget held on plain (a margin no drafting tier beats) served 0.953 of a
plain engine's tokens per second at concurrency 4 on the embedded pair (0.963 at 8), 1.3 ms a step more, of which
its plans' 0.6 ms (a plain engine's: 0.09); held, its plans took 0.36 ms on average (324 of 670 fresh at 4 rows,
where one replaced row of four then counted as two changed of four) and it read 0.958 on a faster machine state
(docs/bench/serving/ plain_split.py, twenty-first session in docs/serving.md). With a replaced row counted once as
new and once as ended (`same_rows`), 96 of 400 plans at 4 rows were fresh, and the plans took 0.27-0.29 ms on
average; with the plain tier's program called without the lagging draft's state and without its all-0 limits
(engine.py), its device step took what a plain engine's does, and the budget held on plain read 0.977 of plain at
concurrency 4 (twenty-second session in docs/serving.md).
A request alone whose fresh plan drafts the widest tier in full (its limit the tier's length) holds that tier the
same way (thirty-second session): the next Budget.hold plans over the same request take it, each with the row's
limit from its estimates then (`tier_limits`, as for a tier chosen ahead: a shorter limit, or plain when they draft
nothing), and choose nothing. Nothing wider is compiled, and at one row a plan is all the host work a step has beyond
a fixed engine's: served request by request beside the fixed gamma 4 (docs/bench/serving/paired_c1.py), the
budget's requests that ran gamma 4 at every step, as the fixed engine did, took 0.81-0.96 ms more a step, and
0.15-0.65 ms with this hold. Held at any drafting tier, the budget kept its first steps' gamma-2 choices and read
0.959 of the fixed gamma 4's tokens per second at c=1 (thirty-first session, docs/serving.md).

This is vLLM's adaptive verification (draft slots admitted by survival against step costs profiled at start-up)
restricted to the compiled widths. A tree speculation has two tiers, plain and its tree (a tree has no per-row
limit; its E sums the survivals of its depths, as a chain of its depth). Exact in every case: the limits come
from verdicts of earlier steps only, and a row at limit 0 is decoded by the target alone (schedules.py's
argument; the engine's exactness tests run under the budget).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

import numpy as np

from jaxspec.checks import check_int
from jaxspec.decoding.device.estimates import PRIOR_ALPHA, observed
from jaxspec.errors import SettingsError

DEFAULT_TIERS = (0, 1, 2, 4)  # and the speculation's gamma
THETA = 0.2  # a row drafts position j only while its survival s(b, j) is at least this
REPEATS = 3  # warmup: 2 REPEATS interleaved rounds over the step programs; REPEATS timed wakes and catch-ups
FEW_ROWS = 4  # warmup: at R < FEW_ROWS rows FEW_ROWS // R times the rounds (steps of a few ms: their ratios spread)
MARGIN = 0.0  # a drafting tier's cost is raised by this share in the choice (module docstring)
IDLE = 0.0  # the share of the next step a finished row's slot is taken to stay empty when no request waits (0: off)
STICK = 0.1  # another tier must score this share above the previous step's tier to replace it
AHEAD = 8  # a step of at least this many active rows has the next one's tier chosen while it runs (0: never)
HOLD = 4  # a fresh plan that chose plain stands for this many more plans over about the same rows (0: none)
LEARN = 0.1  # each served step's weight in its row bucket's curves (CostCurves.observe; 0: warmup's curves stay)
PROBE = 0.02  # the share of the serving time the probes of the tiers not run may lose, by the choice's own scores
LEVEL_LEARN = 0.25  # the weight of a step that sets a side's or a tier's level in its curves (probes.py)
# A plain step right after a drafting one is dearer for a few steps (the embedded pair at 4 and 8 rows: +40 %, +8-12 %,
# +3-4 %, then as after plain steps; docs/bench/serving/plain_settle.log), a drafting step after plain for one (its
# catch-up): the steps of a side run after a switch before one is timed as its cost (warmup, probes.py).
PLAIN_SETTLE, DRAFT_SETTLE = 3, 1
SIDE, TIER = "side", "tier"  # CostCurves.observe's levels: a side's curves alone, or one tier's
DEFAULT_COST_PER_TOKEN = 0.1  # c(R, k) = 1 + 0.1 k (relative) until warmup measured the curves


def settle_steps(k: int) -> int:
  """The untimed steps a tier of draft length k (0: plain) runs after a step of the other side before its cost is
  timed (warmup's rounds; a probe's steps and the level a switch sets: probes.py)."""
  return PLAIN_SETTLE if k == 0 else DRAFT_SETTLE


@dataclasses.dataclass(frozen=True)
class Budget:
  """The verification budget's settings (static: its tiers are compiled programs).

  tiers: the draft lengths compiled (0 is plain decoding, always added; each <= the speculation's gamma, which is
    always added); None: DEFAULT_TIERS. theta: in [0, 1], the survival a row's draft position needs to be drafted.
    repeats: >= 1, warmup times each step program in 2 repeats interleaved rounds (the cost curves:
    `curves_from_rounds`) and the wakes and catch-ups repeats times. margin: >= 0, the share a drafting tier's cost
    is raised by in the choice (the module docstring). learn: in [0, 1], each served step's weight in its row
    bucket's costs (CostCurves.observe: the machine's speed; 0: warmup's curves stay as measured). idle: in [0, 1],
    the share of the next step a row's slot is taken to stay empty after the step it ends in, when no request waits
    (`choose`; 0, the default: not counted). stick: >= 0, the share by which another tier's score must beat the
    previous step's tier to replace it (`choose`'s `current`; 0: the best score always runs). ahead: >= 0, a step of
    at least this many active rows has the next step's tier chosen while it runs on the device (`Ahead`; 0: never):
    its plan then costs the step nothing, one step behind the estimates. hold: >= 0, a fresh plan (or one made
    ahead) that chose plain, or a request alone's fresh plan that drafts the widest tier in full, stands for this
    many more plans at its row bucket over about the same rows (`Ahead.holds`; 0: every plan chooses): they cost
    the host nothing. probe: in [0, 1), the share of the serving
    time that probes of the tiers not run (the other side's best, the running side's other tiers), which measure
    their costs against the running tier's, may lose by the choice's own scores (`probes.SideRuns`; 0: none).
    ages: whether the choice weighs each row's estimates carried to its request's age (ages.py: the served steps'
    acceptance by age; False: the device's estimates as they are). lengths: whether a row's early end is drawn
    from the served requests' lengths given the tokens it gave (EndRate.remaining; False: one hazard a token)."""

  tiers: tuple[int, ...] | None = None
  theta: float = THETA
  repeats: int = REPEATS
  margin: float = MARGIN
  learn: float = LEARN
  idle: float = IDLE
  stick: float = STICK
  ahead: int = AHEAD
  probe: float = PROBE
  hold: int = HOLD
  ages: bool = True
  lengths: bool = True

  def __post_init__(self):
    if self.tiers is not None:
      if isinstance(self.tiers, (str, bytes)) or not isinstance(self.tiers, Sequence) or not self.tiers:
        raise SettingsError(f"Budget.tiers must be a non-empty sequence of draft lengths, got {self.tiers!r}.")
      for k in self.tiers:
        check_int(k, "Budget.tiers' draft length", 0)
      object.__setattr__(self, "tiers", tuple(int(k) for k in self.tiers))
    if isinstance(self.theta, bool) or not isinstance(self.theta, (int, float)) or not 0 <= self.theta <= 1:
      raise SettingsError(f"Budget.theta must be a number in [0, 1], got {self.theta!r}.")
    check_int(self.repeats, "Budget.repeats", 1)
    if (isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not 0 <= self.margin < 10
        or self.margin != self.margin):
      raise SettingsError(f"Budget.margin must be a number in [0, 10), got {self.margin!r}.")
    if isinstance(self.learn, bool) or not isinstance(self.learn, (int, float)) or not 0 <= self.learn <= 1:
      raise SettingsError(f"Budget.learn must be a number in [0, 1], got {self.learn!r}.")
    if isinstance(self.idle, bool) or not isinstance(self.idle, (int, float)) or not 0 <= self.idle <= 1:
      raise SettingsError(f"Budget.idle must be a number in [0, 1], got {self.idle!r}.")
    if isinstance(self.stick, bool) or not isinstance(self.stick, (int, float)) or not 0 <= self.stick < 10:
      raise SettingsError(f"Budget.stick must be a number in [0, 10), got {self.stick!r}.")
    check_int(self.ahead, "Budget.ahead", 0)
    check_int(self.hold, "Budget.hold", 0)
    for name in ("ages", "lengths"):
      if not isinstance(getattr(self, name), bool):
        raise SettingsError(f"Budget.{name} must be True or False, got {getattr(self, name)!r}.")
    if isinstance(self.probe, bool) or not isinstance(self.probe, (int, float)) or not 0 <= self.probe < 1:
      raise SettingsError(f"Budget.probe must be a number in [0, 1), got {self.probe!r}.")

  def tiers_for(self, gamma: int) -> tuple[int, ...]:
    """The sorted draft lengths compiled for a speculation of `gamma`: 0, gamma and the tiers in between;
    SettingsError naming a tier above gamma."""
    wanted = DEFAULT_TIERS if self.tiers is None else self.tiers
    if self.tiers is not None and max(wanted) > gamma:
      raise SettingsError(f"Budget.tiers {list(wanted)} (--budget_tiers) go beyond the speculation's gamma={gamma}.")
    return tuple(sorted({0, gamma} | {k for k in wanted if k <= gamma}))


@dataclasses.dataclass
class CostCurves:
  """c(R, k): seconds of one step at row bucket R and draft length k (0: plain), as warmup timed them (2
  `Budget.repeats` interleaved rounds: `curves_from_rounds`). A pair not measured gets DEFAULT_COST_PER_TOKEN's
  relative model."""

  seconds: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)
  # catchup[R]: seconds a drafting step at row bucket R costs beyond c(R, k) right after plain steps (its drafts
  # caught up from a lag longer than gamma: a re-feed from position 0), as warmup timed it.
  catchup: dict[int, float] = dataclasses.field(default_factory=dict)
  # settle[R]: seconds the first `settle_steps(0)` plain steps at row bucket R cost beyond as many of c(R, 0) right
  # after a drafting step, as warmup timed them: what a run of drafting from plain pays on its return.
  settle: dict[int, float] = dataclasses.field(default_factory=dict)
  # wake[P]: seconds of a draft model's prefill of one request at prompt bucket P (the wake of a row inserted
  # without it, paid at its first drafting step), as warmup timed it: `choose`'s per_token.
  wake: dict[int, float] = dataclasses.field(default_factory=dict)

  def get(self, rows: int, k: int) -> float:
    if (rows, k) in self.seconds:
      return self.seconds[(rows, k)]
    return 1.0 + DEFAULT_COST_PER_TOKEN * k

  @property
  def measured(self) -> bool:
    return bool(self.seconds)

  def lines(self) -> list[str]:
    """One line per row bucket: 'rows R: k=0 1.2 ms, k=1 1.5 ms, ..., catch-up 0.4 ms' (launch/serve.py prints
    them)."""
    out = []
    for rows in sorted({r for r, _ in self.seconds}):
      cells = ", ".join(f"k={k} {self.seconds[(r, k)] * 1e3:.2f} ms" for r, k in sorted(self.seconds) if r == rows)
      if rows in self.catchup:
        cells += f", catch-up {self.catchup[rows] * 1e3:.2f} ms"
      if rows in self.settle:
        cells += f", plain's settle {self.settle[rows] * 1e3:.2f} ms"
      out.append(f"rows {rows}: {cells}")
    if self.wake:
      out.append("a request's draft prefill (wake) by prompt bucket: " + ", ".join(
          f"{bucket} {seconds * 1e3:.2f} ms" for bucket, seconds in sorted(self.wake.items())))
    return out

  def observe(self, rows: int, k: int, seconds: float, weight: float, levels: str | None = None) -> None:
    """Moves row bucket `rows`' curves (every tier's c(rows, .) and its catch-up) by one factor, that which takes
    c(rows, k) `weight` of the way to a step's measured `seconds` (an exponential average of the steps served; a
    timing beyond half or twice the curve counts as that bound: one slow step, a pause, moves them little). The
    machine's speed is learnt and the ratios between tiers stay warm-up's (the module docstring). levels: SIDE moves
    the curves of k's side alone (plain decoding, or every drafting tier), TIER c(rows, k) alone, neither the
    catch-up: a side's or a tier's cost against the running one's, measured a step after it (probes.py). A pair
    warmup did not measure is left alone."""
    if levels not in (None, SIDE, TIER):
      raise ValueError(f"CostCurves.observe's levels must be None, {SIDE!r} or {TIER!r}, got {levels!r}.")
    if (rows, k) in self.seconds and seconds > 0:
      now = self.seconds[(rows, k)]
      factor = 1.0 + weight * (min(max(seconds, 0.5 * now), 2.0 * now) / now - 1.0)
      moved = [key for key in self.seconds if key[0] == rows and (
          levels is None or (levels == SIDE and (key[1] > 0) == (k > 0)) or key[1] == k)]
      for key in moved:
        self.seconds[key] *= factor
      if levels is None:
        for extra in (self.catchup, self.settle):
          if rows in extra:
            extra[rows] *= factor


def curves_from_rounds(rounds: dict[int, Sequence[float | None]]) -> dict[int, float]:
  """c(R, k) per draft length k from one row bucket's warm-up rounds: rounds[k][r] the seconds of tier k's timed
  step in round r (None: not timed). Plain's (k = 0) is the median of its timings; a drafting tier's is that times
  the median over the rounds of its ratio to the same round's plain step (its own median where no round timed
  both). The steps of one round run within a second or so, so a slow spell of the machine shifts them together and
  leaves their ratio: timed in blocks of one tier after another (3 steps each, two passes), the embedded pair's
  ratio of a gamma-2 to a plain step at 8 rows read 2.1 in one warm-up and 3.5 in the next on this project's CPU.
  Tiers without a timing are left out."""
  def median(values):
    return float(statistics.median(values))
  plain = rounds.get(0, ())
  base = [t for t in plain if t is not None]
  out = {0: median(base)} if base else {}
  for k, times in rounds.items():
    own = [t for t in times if t is not None]
    if k == 0 or not own:
      continue
    ratios = [t / p for t, p in zip(times, plain) if t is not None and p is not None and p > 0]
    out[k] = median(base) * median(ratios) if base and ratios else median(own)
  return out


@dataclasses.dataclass
class EndRate:
  """The served requests' chance of ending (EOS, a stop string, a client gone: anything but their max_tokens)
  after any token: decayed counts over the requests that finished (each weighs `DECAY` times the one after it,
  about the last 50), rate = ends / tokens, from a prior of PRIOR_TOKENS tokens without an end (decayed like the
  rest: one short request does not set it). Requests that ignore EOS are not counted (the engine gives them 0)."""

  PRIOR_TOKENS = 64.0

  ends: float = 0.0
  tokens: float = PRIOR_TOKENS
  # The last LENGTHS finished requests' (tokens given, whether they ended early): what `remaining` draws from.
  lengths: list[tuple[int, bool]] = dataclasses.field(default_factory=list)
  # (lengths, their tokens [N] float64, whether each ended early [N] bool): `remaining`'s, per list of lengths
  _arrays: tuple | None = dataclasses.field(default=None, repr=False, compare=False)

  DECAY = 0.98
  LENGTHS = 64
  SAMPLES = 8  # `remaining` needs this many finished requests (before: None, the hazard alone)

  def observe(self, tokens: int, ended: bool) -> None:
    """One request finished after giving `tokens` tokens; ended: it stopped before its max_tokens."""
    self.ends = self.DECAY * self.ends + float(ended)
    self.tokens = self.DECAY * self.tokens + float(max(tokens, 1))
    self.lengths = (self.lengths + [(int(tokens), bool(ended))])[-self.LENGTHS:]

  def remaining(self, given: np.ndarray, eos: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The tokens each row has left before it ends early, as the served requests' lengths tell it given the tokens
    it gave: (R, w) [A, N], R[b, n] = L_n - given[b] for each finished request n longer than given[b] (inf for one
    that ran to its max_tokens: it did not end early, which for a row of a larger max_tokens is a guess), w[b, n]
    1 where it counts, else 0. A row that ignores EOS
    (eos[b] False) or is longer than every such request has one sample of inf (no early end: its `left` caps it).
    None with fewer than SAMPLES finished requests. A translation's length is about set by its source, so the
    chance it ends within the next tokens grows with the tokens it gave, which one hazard a token (`rate`) leaves
    out: at 1/27 a token it took a quarter of a gamma-4 step's 16 tokens from a row 5 tokens into a 27-token
    translation, which gives them all (issue 39, twenty-ninth session, docs/serving.md)."""
    if len(self.lengths) < self.SAMPLES:
      return None
    if self._arrays is None or self._arrays[0] is not self.lengths:  # built again when a request finished
      self._arrays = (self.lengths, np.asarray([t for t, _ in self.lengths], np.float64),
                      np.asarray([e for _, e in self.lengths], bool))
    _, tokens, early = self._arrays
    given = np.asarray(given, np.float64)[:, None]
    left = np.where(early, tokens[None] - given, np.inf)  # [A, N]
    counts = (tokens[None] > given) & np.asarray(eos, bool)[:, None]
    none = ~counts.any(axis=1)
    remaining = np.concatenate([np.where(counts, left, np.inf), np.full((len(given), 1), np.inf)], axis=1)
    weights = np.concatenate([counts, none[:, None]], axis=1).astype(np.float64)
    return remaining, weights

  @property
  def rate(self) -> float:
    return self.ends / self.tokens


@dataclasses.dataclass
class AcceptancePrior:
  """A new request's acceptance estimates a(j) per draft position (its insert's prior, where its unverified
  positions relax): the served requests' verdicts, pooled per position over the requests that finished (each one's
  alone, `estimates.observed`: its estimates less its own prior's share; each request's weighing DECAY times the
  next one's: about the last ten), at a(j) = (its verdicts' sum + START a(j - 1)) / (their count + START), from
  a(-1) = PRIOR_ALPHA. A position with few verdicts takes the one before it: while the budget drafts 2 tokens no
  third is verified, and a third held at 0.8 can keep it at gamma 2 (the Qwen pair at c=1 drafted at gamma 2 at 44
  of 55 steps, from a prior pooled with a fixed 0.8 at each position, where the fixed gamma 4 served 1.08x its
  tokens per second). A request that never drafted adds nothing, nor ages the others (a load decoded plain keeps
  what the drafting ones told). A fixed prior scored the Qwen pair's tiers about alike at 1 row (a gamma-4 step
  3.36 tokens an iteration at 0.8 a position, against its cost of 3.49 plain steps) where its requests' own
  acceptance made the fixed gamma 4 1.21x plain: a request alone began plain, where nothing is verified, and the
  budget drafted at 34 of 93 steps (docs/serving.md). It also keeps the last RECENT requests that drafted and ran
  to their end (`recent`: their final estimates and lengths), by which a request alone that verified nothing weighs
  a first drafting step against plain (lookahead.py): where requests differ, the pool's mean alone kept a request
  alone plain, where nothing is verified, after one poorly drafted request."""

  beta_sum: np.ndarray  # [G] float64: the decayed sum of the served requests' verdicts
  count: np.ndarray  # [G] float64: their decayed count
  # The last RECENT requests that drafted and ran to their end: (their final estimates a(j) [G], the tokens they
  # gave), what a request alone that verified nothing weighs a first drafting step by (lookahead.py).
  recent: list[tuple[np.ndarray, int]] = dataclasses.field(default_factory=list)

  DECAY = 0.9
  START = 2.0
  RECENT = 16

  @classmethod
  def start(cls, positions: int) -> "AcceptancePrior":
    """No request served: PRIOR_ALPHA at every one of `positions` draft positions."""
    return cls(beta_sum=np.zeros((positions,)), count=np.zeros((positions,)))

  def observe(self, beta_sum: np.ndarray, count: np.ndarray, prior: np.ndarray, tokens: int | None = None) -> None:
    """One request finished: its last estimates (beta_sum, count [G], the host's copy of the device's), the
    prior [G] its insert gave it, and the tokens it gave when it ran to its end (None: cut short, freed)."""
    seen_sum, seen = observed(np.asarray(beta_sum, np.float64), np.asarray(count, np.float64),
                              np.asarray(prior, np.float64))
    seen = np.maximum(seen, 0.0)  # (float32 rounding near the prior)
    if seen.max(initial=0.0) < 1e-3:  # it never drafted: it neither counts nor ages the others
      return
    self.beta_sum = self.DECAY * self.beta_sum + np.clip(seen_sum, 0.0, seen)
    self.count = self.DECAY * self.count + seen
    if tokens is not None:
      alpha = np.clip(np.asarray(beta_sum, np.float64) / np.maximum(np.asarray(count, np.float64), 1e-6), 0.0, 1.0)
      self.recent = (self.recent + [(alpha, int(tokens))])[-self.RECENT:]

  @property
  def alpha(self) -> np.ndarray:
    """[G] float32: the prior a new request's row starts at (SlotEngine.insert)."""
    out, before = np.empty(self.count.shape, np.float32), PRIOR_ALPHA
    for j, (beta_sum, count) in enumerate(zip(self.beta_sum.tolist(), self.count.tolist())):
      out[j] = before = (beta_sum + self.START * before) / (count + self.START)
    return out


@dataclasses.dataclass(frozen=True)
class Choice:
  """One step's choice: the tier (its index in the tiers and its draft length), each row's limit, and the score."""

  tier: int
  k: int
  limits: np.ndarray  # [A] int32 per active row, in [0, k]
  expected: float  # E(k): expected tokens of the step over the active rows (per iteration without `left`)
  cost: float  # c'(R, k): the step cost the choice weighed (a drafting tier's raised by the margin)
  other: "Choice | None" = None  # the other side's best tier (plain against drafting; None: it has none)
  rivals: "tuple[Choice, ...]" = ()  # its side's other tiers some row would draft in (`probes.SideRuns.due`)


def survival(alpha: np.ndarray) -> np.ndarray:
  """[A, G] s(b, j + 1) = a(b, 1) ... a(b, j + 1) from alpha [A, G] (the device's estimates)."""
  return np.minimum(np.maximum(np.asarray(alpha, np.float64), 0.0), 1.0).cumprod(axis=-1)  # np.clip: 2x the time


def row_limits(surv: np.ndarray, k: int, theta: float) -> np.ndarray:
  """[A] int32: per row the largest j <= k with s(b, j) >= theta (0: none). Survivals never grow with j, so that
  is the count of leading positions at or above theta."""
  if k == 0:
    return np.zeros((surv.shape[0],), np.int32)
  return np.sum(np.cumprod(surv[:, :k] >= theta, axis=1), axis=1).astype(np.int32)


def tier_limits(alpha: np.ndarray, k: int, theta: float, tree: bool = False) -> np.ndarray:
  """[A] int32 each row's draft limit in a tier of draft length k from its estimates alpha [A, G]: `row_limits`
  of its survivals for a chain, k for a tree (every row drafts the whole tree). What `choose` gives a tier."""
  if tree:
    return np.full((np.shape(alpha)[0],), k, np.int32)
  return row_limits(survival(alpha), k, theta)


@dataclasses.dataclass(frozen=True)
class Ahead:
  """The next step's tier, chosen while a step ran on the device (`SlotEngine._plan_ahead`: the host's plan costs
  the step nothing; issue 39) over the rows expected to decode on after it, or a fresh plan's plain tier held for
  the next `steps` plans (Budget.hold). The next plan takes its tier, with each row's limit from the estimates
  then (`tier_limits`), when the rows are still about those it was chosen over: the same row bucket, at most a
  quarter of them new and at most a quarter ended beyond the expected (`same_rows`); else it chooses again. A
  row is its request (the engine's insert serial), not its slot: a new request in the slot of one that ended is
  another row."""

  tier: int
  requests: np.ndarray  # [A] int: the rows it was chosen over, by their requests' insert serials
  rows: int  # the row bucket it was chosen at
  steps: int = 1  # the plans it stands for

  def holds(self, requests: np.ndarray, rows: int) -> bool:
    """Whether it still stands for the active rows of `requests` [A'] (insert serials) at row bucket `rows`."""
    return rows == self.rows and same_rows(self.requests, requests)


def same_rows(before: np.ndarray, now: np.ndarray) -> bool:
  """Whether the rows `now` [A'] are about the rows `before` [A] (both by their requests' insert serials): at most a
  quarter of them new (inserted since) and at most a quarter of `before` gone (ended), so that a request that ends
  and the next one taking its place count once each side. What a plan made ahead or held (`Ahead.holds`) and the
  stick (`choose`'s `current`, SlotEngine.plan_step) hold over. Counted together (at most a quarter of len(now)
  changed), one replaced row of four was half of them: at concurrency 4 the held plain choice was planned afresh
  at 324 of 670 steps (twenty-second session, docs/serving.md). A request alone that ends and the next is all new."""
  before, now = set(np.asarray(before).tolist()), set(np.asarray(now).tolist())  # a few rows: sets, not numpy's
  return 4 * len(now - before) <= len(now) and 4 * len(before - now) <= len(before)


def expected_tokens(surv: np.ndarray, limits: np.ndarray, left: np.ndarray | None = None,
                    iterations: int = 1) -> float:
  """E = sum_b min(left[b], iterations (1 + s(b, 1) + ... + s(b, limits[b]))); without `left` (no cap)
  iterations times sum_b (1 + s(b, 1) + ... + s(b, limits[b]))."""
  return float(np.sum(_per_row(per_row_rate(surv, limits), left, iterations)[0]))


def per_row_rate(surv: np.ndarray, limits: np.ndarray) -> np.ndarray:
  """[A] each row's expected tokens an iteration: 1 + s(b, 1) + ... + s(b, limits[b])."""
  take = np.arange(surv.shape[1])[None] < limits[:, None]
  return 1.0 + np.sum(np.where(take, surv, 0.0), axis=1)


def within(potential: np.ndarray, hazard: np.ndarray | None) -> np.ndarray:
  """[A] the tokens a row is expected to give of `potential` [A] tokens it would give if it did not end, when it
  ends (EOS, a stop string) after each token with probability hazard [A] (0 or None: it never ends early):
  sum_{t < T} (1 - h)^t = (1 - (1 - h)^T) / h."""
  if hazard is None:
    return potential
  h = np.minimum(np.maximum(np.asarray(hazard, np.float64), 0.0), 1.0)
  safe = np.where(h > 0, h, 1.0)
  return np.where(h > 0, (1.0 - (1.0 - h) ** potential) / safe, potential)


def within_lengths(potential: np.ndarray, remaining: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
  """[..., A] the tokens a row is expected to give of `potential` [..., A] when it ends after the tokens it has
  left, drawn from `remaining` (EndRate.remaining: R, w [A, N]): sum_n w min(potential, R) / sum_n w."""
  values, weights = remaining
  return (np.minimum(np.asarray(potential, np.float64)[..., None], values) * weights).sum(-1) / weights.sum(-1)


def _per_row(per_iteration: np.ndarray, left: np.ndarray | None, iterations: int,
             hazard: np.ndarray | None = None, idle: float = 0.0,
             remaining: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray | float]:
  """([..., A] each row's expected tokens in the step, [...] the share of the step's iterations expected to run)
  from per_iteration [..., A] (`per_row_rate`, e_b; `choose` passes every tier's at once, [T, A]):
  min(left_b, `within`(I e_b, hazard_b)). The loop stops once every row has ended, at its max_tokens (after n_b =
  ceil(left_b / e_b) iterations) or early (EOS, a stop string: after each token with chance hazard_b), so the
  share is the mean over the I iterations of the chance that some row still decodes at the i-th: 1 - prod_b (1 -
  [i < n_b] (1 - h_b)^(i e_b)); max_b min(I, n_b) / I without a hazard, 1 without `left` or a hazard. A row's early
  end thus costs its tokens and, when no other row decodes on (one request alone), the iterations it would have
  run. idle: the share of the next step a row that ends within this one leaves its slot empty (no request
  waits: the next one arrives during that step and is inserted after it), so its tokens count 1 / (1 + idle p_b),
  p_b its chance of ending within the step (1 when left_b <= I e_b): the slot is busy a share 1 / (1 + idle p_b)
  of the time. remaining: the tokens each row has left before an early end, as samples (EndRate.remaining),
  in place of the hazard: `within_lengths`, and a row at its i-th iteration while its draw is above i e_b."""
  potential = iterations * per_iteration
  h = None if hazard is None else np.minimum(np.maximum(np.asarray(hazard, np.float64), 0.0), 1.0)
  if remaining is not None:
    h = None
    per_row, share = within_lengths(potential, remaining), 1.0
  else:
    per_row, share = within(potential, h), 1.0
  if left is not None:
    left = np.asarray(left, np.float64)
    capped = np.minimum(per_row, left)
  else:
    capped = per_row
  if per_row.shape[-1] and (left is not None or h is not None or remaining is not None):
    # Iteration i runs while a row is still decoding: row b is at its i-th with chance [i < n_b] (1 - h_b)^(i e_b),
    # n_b = ceil(left_b / e_b) its iterations before max_tokens; the loop, with 1 - prod_b (1 - that).
    i = np.arange(iterations, dtype=np.float64)[:, None]  # [I, 1]: broadcast against [..., 1, A]
    rate = per_iteration[..., None, :]
    alive = None if left is None else i < np.ceil(np.maximum(left, 1.0) / rate)
    if h is not None:
      kept = (1.0 - h) ** (i * rate)
      alive = kept if alive is None else alive * kept
    if remaining is not None:  # [..., I, A]: the share of its draws above the tokens given before iteration i
      values, weights = remaining
      kept = ((values > (i * rate)[..., None]) * weights).sum(-1) / weights.sum(-1)
      alive = kept if alive is None else alive * kept
    share = 1.0 - (1.0 - alive).prod(axis=-1).mean(axis=-1)
  if idle:
    # p_b = 1 - (1 - h)^T = h within(T, h): its chance of ending within the step (0 without a hazard)
    ends = np.zeros_like(potential) if h is None else h * per_row
    if remaining is not None:
      values, weights = remaining
      ends = ((values <= np.asarray(potential)[..., None]) * weights).sum(-1) / weights.sum(-1)
    if left is not None:
      ends = np.where(left <= potential, 1.0, ends)
    capped = capped / (1.0 + idle * ends)
  return capped, share


def choose(alpha: np.ndarray, tiers: Sequence[int], costs: Sequence[float], theta: float,
           tree: Sequence[bool] | None = None, left: np.ndarray | None = None, iterations: int = 1,
           margin: float = 0.0, behind: np.ndarray | None = None, catchup: float = 0.0,
           hazard: np.ndarray | None = None, idle: float = 0.0, current: int | None = None,
           stick: float = 0.0, per_token: np.ndarray | None = None, settle: float = 0.0,
           remaining: tuple[np.ndarray, np.ndarray] | None = None) -> Choice:
  """The tier maximising E(k) / c(R, k) over the active rows' estimates alpha [A, G] (module docstring); ties go
  to the shorter tier. tiers: increasing draft lengths; costs: c(R, k) per tier, taken as their running maximum (a
  wider tier is never cheaper than a narrower one: a timing below a narrower tier's is noise). tree: per tier,
  whether it is a tree (no per-row limit: every row drafts the whole tree, and E counts its depths' survivals).
  left: [A] the tokens each row may still give (None: no cap); iterations: the step's loop iterations; margin:
  a drafting tier's cost is taken (1 + margin) times; behind: [A] bool rows whose draft rested longer than gamma
  (plain steps since they last drafted): a drafting tier where one of them drafts also pays `catchup` seconds,
  spread over the drafting steps expected to follow (the median over its drafting rows of left_b / (I e_b), at
  least 1: the catch-up is paid once, the drafting it buys lasts; a row's left_b there at most 1 / hazard_b, its
  expected length). hazard: [A] each row's chance of ending (EOS, a stop string) after any token (`EndRate`;
  None: never): a row that ends within a step gives nothing for the rest of it, which weighs most on the widest
  tiers (`within`). idle: the share of the next step a row's slot stays empty after the step it ends in (no
  request waits for a slot: `_per_row`; a longer step keeps it empty longer); 0: a waiting request fills it.
  current: the index of the previous step's tier (None: none), which a tier on the other side of plain decoding
  (drafting after plain, plain after drafting) replaces only when its score is more than (1 + stick) times
  current's: such a switch costs what no score counts (a rested draft's wakes, the next step's share of the host's
  streaming of a wide step's tokens), and estimates that move a little between steps would otherwise flip the
  choice back and forth. Between two drafting tiers the best score runs (at 4 rows on the embedded pair a stick
  there kept gamma-2 steps of 1.19 tokens/ms where the fixed gamma 4's gave 1.29).
  per_token: [A] seconds each row's draft prefill costs per token of its request (the wake a request pays once,
  when it first drafts, over its expected length; None or 0: none): a drafting tier's cost is raised by
  sum_b per_token[b] * E(k, b), what drafting pays per token in a steady state where every new request is woken.
  settle: seconds a return to plain decoding pays after drafting (CostCurves.settle: its first plain steps' excess),
  given when the step before was plain: every drafting tier then pays it, spread as the catch-up over the drafting
  steps expected to follow (a run of drafting from plain ends in that return; from drafting, the return is owed
  whichever side runs now). remaining: (R, w) [A, N] the tokens each row has left before an early end, drawn from
  the served requests' lengths given the tokens it gave (EndRate.remaining), in place of `hazard` (None: the
  hazard's)."""
  surv = survival(alpha)
  n, g = surv.shape
  ks = [int(k) for k in tiers]
  trees = [False] * len(ks) if tree is None else [bool(t) for t in tree]
  # Every tier at once ([T, A] arrays; one plan a step, right after the step's device work, where each numpy call
  # costs several microseconds: their number is kept small, issue 39). A chain tier's row limit is min(k, the
  # row's leading positions at or above theta: survivals never grow with j, so their count), a tree's its nodes.
  lead, caps, has_tree = (surv >= theta).sum(axis=1), np.asarray(ks)[:, None], any(trees)
  limits = np.minimum(caps, lead)  # [T, A]
  if has_tree:
    limits = np.where(np.asarray(trees)[:, None], caps, limits)
  sums = np.zeros((n, g + 1))
  np.cumsum(surv, axis=1, out=sums[:, 1:])  # [A, G + 1] prefix sums: `per_row_rate` is 1 + sums[b, k_b]
  rate = 1.0 + sums[np.arange(n), np.minimum(limits, g) if has_tree else limits]
  per_row, share = _per_row(rate, left, iterations, hazard, idle, remaining)
  expected = per_row.sum(axis=1)
  shares = share.tolist() if isinstance(share, np.ndarray) else [share] * len(ks)
  prefill = [0.0] * len(ks) if per_token is None else (per_row @ np.asarray(per_token, np.float64)).tolist()
  cost, top = [], 0.0
  for i, k in enumerate(ks):  # the running maximum over the tiers, the share of iterations run, the margin
    top = float(costs[i]) if i == 0 else max(top, float(costs[i]))
    cost.append(top * shares[i] * ((1.0 + margin) if k > 0 else 1.0) + (prefill[i] if k > 0 else 0.0))
  drafting = limits > 0
  drafts_any = drafting.any(axis=1).tolist()
  once = [settle if k > 0 else 0.0 for k in ks]  # per tier the seconds it pays once (the catch-up, the return's
  if catchup > 0 and behind is not None:  # settle)
    once = [x + catchup * bool(y) for x, y in zip(once, (drafting & np.asarray(behind, bool)).any(axis=1).tolist())]
  paying = [i for i, x in enumerate(once) if x > 0 and drafts_any[i]]
  if paying and left is not None:
    ahead = np.asarray(left, np.float64)
    if remaining is not None:  # its expected tokens before it ends
      ahead = within_lengths(ahead, remaining)
    elif hazard is not None:
      h = np.asarray(hazard, np.float64)
      ahead = np.where(h > 0, np.minimum(ahead, 1.0 / np.where(h > 0, h, 1.0)), ahead)
    steps, rows = (ahead / (iterations * rate)).tolist(), drafting.tolist()  # a few rows: Python's lists
  for i in paying:  # the median over its drafting rows of left_b / (I e_b), at least 1
    spread = 1.0 if left is None else statistics.median(x for x, d in zip(steps[i], rows[i]) if d)
    cost[i] += float(once[i]) / max(1.0, spread)
  score = (expected / np.asarray(cost)).tolist()
  def scored(i):
    return Choice(tier=i, k=ks[i], limits=limits[i].astype(np.int32), expected=float(expected[i]), cost=cost[i])

  best, tiers_of = {}, {}  # per side (True: drafting, False: plain) its best tier: the first (shortest) of the
  for side in (False, True):  # highest score; and its tiers
    ours = [i for i, k in enumerate(ks) if (k > 0) == side and (not side or trees[i] or drafts_any[i])]
    if ours:  # a chain tier nobody would draft in is plain at a higher cost: skipped
      high = max(score[i] for i in ours)
      best[side], tiers_of[side] = scored(next(i for i in ours if score[i] >= high / (1 + 1e-9))), ours
  winner = max(best.values(), key=lambda c: (c.expected / c.cost, -c.k))
  if current is not None and 0 <= current < len(ks) and len(best) == 2:
    kept = best[ks[current] > 0]  # the previous step's side
    if winner.expected / winner.cost <= (1 + stick) * kept.expected / kept.cost:
      winner = kept
  rivals = tuple(scored(i) for i in tiers_of[winner.k > 0] if i != winner.tier)
  return Choice(tier=winner.tier, k=winner.k, limits=winner.limits, expected=winner.expected, cost=winner.cost,
                other=best.get(winner.k == 0), rivals=rivals)  # (dataclasses.replace: 4x the time)


def from_flags(*, speculation: str, drafts: bool, table: bool, tiers: Sequence[str], theta: float,
               margin: float = MARGIN, repeats: int = REPEATS, probe: float = PROBE) -> Budget | bool:
  """SlotEngine's `budget` argument from launch/serve.py's flags: a Budget with --speculation=budget, a draft
  (`drafts`) and no --speculation_table (`table`), else False (off). tiers: --budget_tiers' texts ([] = the
  defaults); SettingsError naming the flag when one is not an integer. repeats: --budget_repeats. probe:
  --budget_probe."""
  if not drafts or table or speculation == "fixed":
    return False
  try:
    chosen = tuple(int(v) for v in tiers) or None
  except ValueError:
    raise SettingsError(f"--budget_tiers takes integers, got {','.join(tiers)}.") from None
  return Budget(tiers=chosen, theta=theta, margin=margin, repeats=repeats, probe=probe)
