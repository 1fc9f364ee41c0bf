"""The slot engine: continuous batching with speculative decoding inside the step (JetStream's shape).

    engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=8, max_input_length=128,
                        max_new_tokens=128)
    engine.warmup()                                   # compiles every program once
    first = engine.insert(slot, prompt_ids, RequestSettings(max_tokens=32, sampling=jaxspec.Sampling(0.7)))
    first.tokens, first.reason                        # the first token, now (a reason: it ended there)
    out = engine.step()                               # <= iterations_per_step iterations over all active slots
    out.tokens[slot], out.finished[slot], out.reasons[slot]

Where the code lives: this module is the host side (which slot a request fills, which program a step runs, the
requests' settings, the host copies); the device programs it runs (SlotState, the step, insert and wake programs,
the zero state) are jaxspec/decoding/device/slots.py, compiled and placed by jaxspec/decoding/slot_programs.py (their
jits, the layout and the allocation's shardings), beside `generate`'s programs (docs/layers.md). Each table entry's
and insert's static settings come from jaxspec/decoding/planner.py, `generate`'s planner (its checks, the one-child
tree's chain, a plain entry resting the drafter).

State. A fixed number of `slots` (static), each a row of one preallocated loop state (loop.LoopState's fields:
the target's cache, the drafter's state, the token buffer, lengths, done / failed flags, the row's PRNG key) plus
the row's request settings as runtime arrays ([slots] temperature, top_k, top_p, max_tokens, ignore_eos,
min_tokens) and its own iteration count (its keys fold it in). Every shape is fixed when the engine is built: the
caches hold max_new_tokens + the largest slack of any step program (the largest gamma or tree of the table), and
whatever a prefill shapes by the prompt's bucket is padded to max_input_length's bucket (a decoder-only cache's
and a head's prompt positions, the lookup context, T5's cross-attention keys / values and encoder mask, a T5 head's
encoder keys / values and mask: zeros, a False mask).

insert(slot, prompt, settings): one compiled program per prompt bucket (`arguments.bucket_length`: powers of two
from 16, as `generate` pads) and insert mode (greedy, and the most general compiled mode): the batch-1 prefill of
the target and the drafter (loop.prefill), then the row's FIRST loop iteration alone (width 1, the drafter
resting: a plain entry's iteration), padded to the layout and written into row `slot` of every state array (the
slot is a runtime scalar; the state is donated), its key made from its seed (`jax.random.fold_in(key(seed), 0)`:
what `generate` makes for a per-row seed), its settings written; the first new token comes back to the host (one
[4] int32 copy) before the insert returns, so a server streams it before the next step (issue 39: the first token
never waits for drafting). A request whose first token ends it (EOS, max_tokens 1, non-finite logits) is finished
at insert. A draft model's prefill is deferred (served_draft.py: the insert writes a zero draft cache) to the
row's first drafting step, which prefills it first ("wakes" the row; one program per prompt bucket). Nothing of
the slot's previous request survives: every array of the row is overwritten.

step(): ONE compiled program: a `lax.while_loop` of at most iterations_per_step iterations (stopping early when no
slot is active) whose body is the decoding loop's own `iteration` (drafting, one verify call, acceptance,
rollback, the drafter's settle), then the new tokens of every slot, the finished / failed flags and the step's
drafted / accepted counts packed in ONE [R, W] int32 array and copied to the host once. A step decodes R rows,
R the smallest of the engine's `row_buckets` that holds the active slots: those slots (padded with idle, frozen
ones) are gathered from the state, decoded and written back in place (the state is donated; a cache array the
loop never changes, such as T5's cross-attention keys and values, is not written back), so a lightly loaded
engine computes a few rows, not every slot; R == slots decodes the state as it is. Finished rows (EOS,
their max_tokens, non-finite logits) are frozen on the device inside the step (the loop's `done`) and freed on the
host; `free(slot)` stops a slot from the host (its flag goes in with the next step).

Step programs. Per step the engine picks (`plan_step()`: the program's key and the budget's per-slot limits) one
compiled program from the host's view of the active slots, never per request: the `SpeculationTable` entry for
their number (a chain of some gamma, a tree, or plain decoding; one entry when no table is given and the budget
is off), or under the verification budget (budget.py, the default with a speculation and no table) the tier its
choice picks from the rows' acceptance estimates (SlotState.est_sum / est_count, updated in every iteration of a
drafting tier's step and copied back with its tokens; a plain tier's step, a plain engine's program, leaves them
out and the host relaxes its copy by the step's iterations, as the device does at the next drafting step; the
choice weighs them carried to each request's age: ages.py, `age_curve`), the served requests' end rate and lengths
(`ends`) and warmup's step-cost curves as
the steps served refine them (`costs`), with per-row draft limits passed to the device (`LoopState.limit`;
from Budget.ahead rows on, the tier is chosen while the step before runs, and a fresh choice of plain (or a request
alone's of the widest tier in full) stands for the next Budget.hold plans: budget.Ahead; now and then a few steps
probe the side it does not run, plain or drafting: probes.py; a request alone that verified nothing may draft one
step where its choice is plain, by what the last served requests' acceptance and lengths say: lookahead.py);
and the sampling mode of the active rows: "greedy" (every active row at temperature 0: argmax on both sides),
"sampled" (some row samples; no top-k / top-p), "filtered" (some row has top-k / top-p: the sort): each request's
`Sampling.mode` (RequestSettings.sampling, a jaxspec.Sampling). In the sampled modes temperature, top_k and top_p
are per-row arrays (`sampling.warp_probs`); a temperature-0 row gets the one-hot distribution of its argmax on both
sides, which makes the min(1, p/q) acceptance exactly greedy acceptance: its
tokens are its greedy tokens whatever program runs. So the step
programs are, per table entry, (the row buckets its active counts meet) x (the compiled `modes`, all three by
default), plus the inserts (per prompt bucket and insert mode) and wakes (per bucket), all compiled by `warmup`.

Exactness. A row's computation never reads another row (the models are row-independent; finished and idle rows
are frozen), its random draws come from its own key folded with its own iteration count (loop.py), and its token
budget is its own (LoopState.budget). So a request's tokens depend on its prompt, settings and seed and on the
step programs that decode it, never on its slot or its neighbours' tokens: at temperature 0 they are
`generate`'s greedy tokens for its prompt alone, and a seeded sampled request draws the same tokens alone or under
load whenever its steps run the same programs: the same row bucket and sampling mode (and table entry, or the
verification budget's tier and limits, which follow every active row's estimates: budget=False fixes them). Another
row bucket computes the batch in other shapes (another mode: other fused code), which can round differently; a
sampled draw or acceptance test that falls within that rounding of its threshold then flips, and the rest of the
answer differs (still an exact draw from the target's distribution). With a fixed gamma, one row bucket
(`row_buckets=(slots,)`) and one sampled mode compiled make a seeded request the same under any load (at the cost of decoding every slot
each step); a greedy token (an argmax) moves with rounding only at a near tie. The same holds against
`generate(..., seed=[seed])` alone: the same tokens up to the rounding of its batch shapes.
Its first token is drawn at insert as plain decoding draws it (`generate(..., seed=[seed])` without
speculation draws the same token); later iterations draft, so with speculation its draws differ from
`generate`'s speculative ones with the same seed (same distribution: the target's).

The load table. All table entries share one state layout. A plain entry runs the speculation's drafter
through `Drafter.idle` (the loop's resting iterations: width-1 verify calls), so the lookup context and a feature
head stay in sync; a draft model lags and catches up when drafting resumes (served_draft.py; chains: a re-feed
of the lag in one call; trees: by gamma + 1 tokens per iteration, proposals meanwhile junk but verified: exact).
Since a lagging draft's rest changes nothing of its state, a plain entry's programs then leave that state out of
the step (`registry.Served.rest`, `StepProgram.draft_outside`): the step neither gathers nor writes back the
draft's cache, and costs what a plain engine's step costs (60.8 against 59.1 ms at 32 of 64 rows on the embedded
pair, 61.2 against 57.1 before). It is called without that state at all (`without_draft`: passed in and back out
unread, it cost the plain step at 4 rows 1-1.5 %), and, under the verification budget, without the (all-0) per-row
limits (another 1-1.5 % there: docs/bench/serving/plain_step_pieces.log).
A row is woken (its draft model prefilled) only by a step that drafts: while the load runs plain the
speculative server prefills what the plain one does; if the load falls to a drafting entry while the request
runs, its draft is prefilled then and it drafts (served_draft.py).

Mesh and memory. Each array's rows are the axis its cache or drafter state declares ("batch" in
`Decoder.cache_axes` / `Drafter.state_axes`); on a mesh the slots are allocated split as `generate` splits its
batch (rows over `data`, heads over `model` by each model's cache rules) and every insert and step keeps them there
(their outputs constrained to the allocation's shardings; a step's R rows are R / data of each device's own slots,
gathered and written back on that device). Before allocating, the slots' memory is checked
(`memory_guard.check_slots`): CacheTooLargeError naming --slots and the most slots that fit.

Threads: an engine is driven by one thread at a time (insert, step and free replace the donated state); a server
runs them from one loop and hands results to its request handlers. Processes: over several (hosts.py) process 0's
engine plans each step and every process runs that plan (`step(program=key, limits=limits)`), so all run the same
program with the same limits whatever cost curves each timed in its warmup.

Shapes: S slots, R rows decoded by a step (a row bucket), W = iterations_per_step * (max gamma + 1) tokens per
slot and step at most.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Sequence

import jax
import numpy as np

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxspec.decoding import arguments, memory_guard, placement, planner, slot_programs
from jaxspec.decoding.slot_programs import INSERT, STEP, WAKE, InsertProgram, StepProgram, without_draft
from jaxspec.decoding.device import loop
from jaxspec.decoding.device.estimates import PRIOR_ALPHA, PRIOR_COUNT, observed, relaxed
from jaxspec.decoding.drafters import registry
from jaxspec.checks import is_int
from jaxspec.decoding.settings import MODES, Sampling, Speculation
from jaxspec.errors import InputError, SettingsError
from jaxspec.model import Model
from jaxspec.serving import ages
from jaxspec.serving.budget import (FEW_ROWS, LEVEL_LEARN, AcceptancePrior, Ahead, Budget, Choice, CostCurves,
                                    EndRate, choose, curves_from_rounds, per_row_rate, same_rows, settle_steps,
                                    survival, tier_limits, within, within_lengths)
from jaxspec.serving.lookahead import drafts_first
from jaxspec.serving.probes import SideRuns
from jaxspec.serving.requests import RequestSettings
from jaxspec.serving.table import SpeculationTable, TableEntry
from jaxspec.sharding import place, shard

@dataclasses.dataclass(frozen=True)
class InsertOutput:
  """What `insert` produced: the request's first token, and whether it already finished."""

  tokens: list[int]  # [the first new token]; [] when the target's logits were non-finite.
  reason: str | None  # "stop" (EOS), "length" (max_tokens 1), "error" (non-finite logits), None: it decodes on.

  @property
  def finished(self) -> bool:
    return self.reason is not None


@dataclasses.dataclass(frozen=True)
class StepOutput:
  """What one `step` produced, per slot (S slots)."""

  tokens: list[list[int]]  # per slot, the new tokens of this step (EOS included); [] for idle slots.
  finished: np.ndarray  # [S] bool: the slot finished on the device this step (EOS, max_tokens or failed).
  reasons: list[str | None]  # per slot: "stop" (EOS), "length" (max_tokens), "error" (non-finite logits), None.
  drafted: np.ndarray  # [S] int: draft tokens proposed this step.
  accepted: np.ndarray  # [S] int: draft tokens accepted this step.
  iterations: np.ndarray | None = None  # [S] int: the slot's loop iterations (verify calls) this step.
  entry: TableEntry | None = None  # the table entry the step ran (None: no step ran: nothing active).
  mode: str | None = None  # the sampling mode the step ran ("greedy", "sampled", "filtered").
  rows: int | None = None  # the rows the step decoded (its row bucket: the active slots and idle padding).
  # The verification budget's choice (None without a budget): the tier's draft length is entry.gamma (0: plain);
  # limits [S] int: each slot's most draft tokens per iteration in this step (0 for idle slots).
  limits: np.ndarray | None = None



def _budget(budget, speculation, table) -> Budget | None:
  """The engine's verification budget from its `budget` argument (SlotEngine's docstring), or None: off."""
  if budget is None:
    return Budget() if speculation is not None and table is None else None
  if budget is False:
    return None
  if budget is True:
    budget = Budget()
  if not isinstance(budget, Budget):
    raise SettingsError(f"budget must be a jaxspec.serving.Budget, True, False or None, got {type(budget).__name__}.")
  if speculation is None:
    raise SettingsError("budget: the verification budget chooses draft lengths: it needs a speculation (--draft).")
  if table is not None:
    raise SettingsError("budget and table (--speculation_table) both choose the draft length: pass one of them.")
  return budget


def _row_buckets(row_buckets, slots: int, data: int = 1, smallest: int = 1) -> tuple[int, ...]:
  """The sorted row buckets (`slots` always among them); None: `data` times the powers of two from `smallest`
  below `slots`, and `slots`. On a mesh every bucket is a multiple of its `data` axis (the rows a step decodes are
  split over it)."""
  if row_buckets is None:
    return tuple(b for b in (data * 2 ** i for i in range(slots.bit_length())) if smallest * data <= b < slots) + (
        slots,)
  if isinstance(row_buckets, (str, bytes)) or not isinstance(row_buckets, Sequence) or not all(
      is_int(b) and 1 <= b <= slots for b in row_buckets):
    raise SettingsError(f"row_buckets must be a sequence of integers in [1, slots={slots}], got {row_buckets!r}.")
  if any(b % data for b in row_buckets):
    raise SettingsError(f"row_buckets {list(row_buckets)} (--row_buckets) must be multiples of the mesh's data axis "
                        f"({data}): a step's rows are split over it.")
  return tuple(sorted({int(b) for b in row_buckets} | {slots}))


def _platform(mesh) -> str:
  """The platform the slots live on ("cpu", "gpu", "tpu"): the mesh's devices', else the default device's."""
  return (mesh.devices.flat[0] if mesh is not None else jax.devices()[0]).platform


def _largest_below(buckets, n: int) -> int:
  """The largest of `buckets` below n (0: none): the most rows a step gathers from n slots."""
  return max((b for b in buckets if b < n), default=0)


def _buckets(max_input_length: int) -> list[int]:
  """Every padded prompt length `arguments.bucket_length` gives for prompts of 1..max_input_length tokens."""
  out, n = [], 1
  while True:
    b = arguments.bucket_length(n, max_input_length)
    if b not in out:
      out.append(b)
    if b >= max_input_length:
      return out
    n = b + 1


class SlotEngine:
  """A fixed number of decoding slots over one target (and drafter): `insert`, `step`, `free` (module docstring).

  Args:
    target: the model served (T5 or decoder-only).
    speculation: a `jaxspec.Speculation` (draft model, NGramDraft, FeatureHead; chain or tree; schedule
      "constant"), or None for plain decoding.
    slots: rows decoded together (static).
    max_input_length: the longest prompt, in tokens.
    max_new_tokens: the most tokens a request may ask for (its max_tokens).
    iterations_per_step: loop iterations one `step` runs at most.
    table: the load table, a `SpeculationTable` (needs `speculation`: its drafter; the table's entries replace its
      gamma / tree), or None: `speculation`'s gamma and tree for any load.
    mesh: a `jax.sharding.Mesh` (jaxspec.make_mesh) to serve on: the target's parameters are placed on it as
      `jaxspec.shard` places them (a target already placed on a mesh is served there without `mesh`), a draft
      model replicated over `model` and a head replicated, as `generate` does; the slots are split as `generate`
      splits its batch: rows over `data` (`slots` a multiple of it, else SettingsError naming --slots), the
      target's cache heads over `model` by its cache rules, a draft model's cache by its own (replicated over
      `model`), every other drafter state by rows. Row buckets are multiples of `data`, and a step's rows are
      gathered from each device's own slots (`free_slots` fills the `data` groups evenly).
    row_buckets: the batch sizes a step may decode: a step decodes the active slots (padded with idle ones to the
      smallest bucket that holds them), gathered from the slots and written back, so a lightly loaded engine
      computes few rows. None: powers of two below `slots` (times `data` on a mesh), and `slots` (always added);
      on one CPU device from 2 (a one-row slot step is ~3x slower there than a two-row one; `generate` at batch
      1 is not).
      (slots,): every step decodes every slot (with one sampled mode, a seeded request is then the same under any
      load: Exactness, above). Each bucket a table entry can meet is one more step program per mode.
    modes: the sampling modes compiled ("greedy", "sampled", "filtered"; default all three). A request runs in
      the least general compiled mode that decodes it exactly (a greedy row in a sampled program is still
      greedy); one that no compiled mode decodes is refused at insert.
    budget: the verification budget (jaxspec/serving/budget.py): each step picks a compiled draft length (a
      tier, 0 = plain) and per-row limits from the rows' acceptance estimates, the requests' end rate and the
      step-cost curves (warmup's, refined by the steps served). None:
      on (`Budget()`) when `speculation` is given without `table`, else off; False: off (the speculation's fixed
      gamma / tree at every step); True or a `Budget`: on (needs `speculation`, no `table`). Over several
      processes process 0 chooses (`plan_step`) and every process runs its choice (`step(program=, limits=)`:
      jaxspec/serving/hosts.py).

  Before allocating, the slots' memory is checked against a device's free memory (`memory_guard.check_slots`:
  the caches at slots x (prompt bucket + max_new_tokens + the widest step's slack) for the target and the
  drafter, the table's widest step, per device on a mesh): CacheTooLargeError naming --slots and the most slots
  that fit at these lengths.
  """

  def __init__(self, target: Model, speculation: Speculation | None = None, *, slots: int, max_input_length: int,
               max_new_tokens: int, iterations_per_step: int = 4, table: SpeculationTable | None = None,
               mesh=None, row_buckets: Sequence[int] | None = None, modes: Sequence[str] = MODES,
               budget: Budget | bool | None = None):
    planner.check_models(target, speculation)
    if speculation is not None and speculation.schedule != "constant":
      raise SettingsError(f"the slot engine runs schedule 'constant' (speculation by load comes from "
                          f"`table`, a SpeculationTable), got schedule {speculation.schedule!r}.")
    for name, value in (("slots", slots), ("max_input_length", max_input_length),
                        ("max_new_tokens", max_new_tokens), ("iterations_per_step", iterations_per_step)):
      if not is_int(value) or value < 1:
        raise SettingsError(f"{name} must be an integer >= 1, got {value!r}.")
    if isinstance(modes, str) or not isinstance(modes, Sequence) or not modes or any(m not in MODES for m in modes):
      raise SettingsError(f"modes must be a non-empty sequence of {MODES}, got {modes!r}.")
    self.modes = tuple(m for m in MODES if m in modes)
    if table is not None and not isinstance(table, SpeculationTable):
      raise SettingsError(f"table must be a SpeculationTable or None, got {type(table).__name__}.")
    if table is not None and speculation is None and table.max_gamma > 0:
      raise SettingsError("table: a load table that drafts needs a speculation (its draft).")
    placed_on = placement.mesh_of(target.params)
    if mesh is not None and not isinstance(mesh, Mesh):
      raise SettingsError(f"mesh must be a jax.sharding.Mesh (jaxspec.make_mesh(...)) or None, got "
                          f"{type(mesh).__name__}.")
    if mesh is not None and placed_on is not None and placed_on != mesh:
      raise SettingsError("the target is placed on another mesh than `mesh`: pass one of them.")
    if mesh is not None and placed_on is None:
      target = shard(target, mesh)  # the parameters as `generate` finds them on a mesh (DEFAULT_RULES)
    self.mesh = placement.mesh_of(target.params)
    data = 1 if self.mesh is None else dict(self.mesh.shape).get("data", 1)
    if slots % data:
      raise SettingsError(f"--slots={slots} is not a multiple of the mesh's data axis ({data}): the slots are split "
                          f"over `data`, slots / {data} per device; pass a multiple of {data} (e.g. "
                          f"{slots + data - slots % data}) or a smaller data axis.")
    # On XLA:CPU a one-row slot step is ~3x slower than a two-row one (22 against 7.6 ms for 4 plain iterations
    # of the embedded target; why was not isolated: `generate` at batch 1 is faster per sequence than at 2), so
    # CPU buckets start at two rows.
    # (One device: a CPU mesh is for tests, and its buckets stay multiples of `data`.)
    self._smallest = 2 if data == 1 and _platform(self.mesh) == "cpu" else 1
    self.row_buckets = _row_buckets(row_buckets, int(slots), data, self._smallest)
    self.target, self.speculation = target, speculation
    self.slots, self.max_input_length, self.max_new_tokens = int(slots), int(max_input_length), int(max_new_tokens)
    self.iterations_per_step = int(iterations_per_step)
    self.tokenizer = target.tokenizer
    cfg = target.config
    self.eos_ids = tuple(cfg.eos_token_ids)
    self.pad_id = cfg.pad_token_id
    # -- verification budget hook: its tiers are the table's entries (every one reachable at every load) --
    self.budget = _budget(budget, speculation, table)
    self.costs = CostCurves()
    self.ends = EndRate()  # the served requests' chance of ending early after a token (the budget's)
    if self.budget is not None:
      if speculation.tree is not None:
        tiers = (TableEntry(max_active=1, gamma=0), TableEntry(max_active=2, gamma=speculation.gamma,
                                                                tree=speculation.tree))
      else:
        tiers = tuple(TableEntry(max_active=i + 1, gamma=k)
                      for i, k in enumerate(self.budget.tiers_for(speculation.gamma)))
      table = SpeculationTable(tiers)
    # -- end of the budget hook --
    if table is None:
      if speculation is None:
        table = SpeculationTable((TableEntry(max_active=self.slots, gamma=0),))
      else:
        table = SpeculationTable((TableEntry(max_active=self.slots, gamma=speculation.gamma,
                                             tree=speculation.tree),))
    if speculation is not None and table.max_gamma == 0:
      raise SettingsError("the speculation table has no drafting entry (gamma 0 at every load), so its draft would "
                          "never run: serve without one (speculation=None, --draft=none) or give an entry a gamma.")
    self.table = table
    source = self._source = planner.draft_source(target, speculation)
    # A draft model catches up after plain / tree steps, and its prefill waits for the row's first drafting step
    # (served_draft.py, through the registry).
    served = registry.served(source.drafter, lags=any(e.plain or e.tree is not None for e in table.entries))
    drafter, self.draft_params = served.drafter, placement.draft_params_on(source, self.mesh)  # as generate places it
    self.target_params = target.params
    self._programs: dict[tuple[int, str, int], StepProgram] = {}
    width = self.iterations_per_step * (table.max_gamma + 1)
    alloc, planned = None, []
    for i, entry in enumerate(table.entries):
      # A plain entry rests the drafter (`Drafter.idle`), keeping its state in sync, or with a draft model that
      # lags (served.rest) leaves its state out of the step: plain decoding as a plain engine's step runs it.
      outside = entry.plain and served.rest is not None
      for mode in self.modes:
        # A budget's chain tier verifies gamma + 1 positions every iteration (planner.plan's fixed_width).
        step = planner.plan(target, served.rest if outside else drafter, mode, max_new_tokens=self.max_new_tokens,
                            gamma=entry.gamma, tree=entry.tree, plain=entry.plain,
                            rests=speculation is not None and not outside, fixed_width=self.budget is not None)
        planned.append(((i, mode), step.settings, step.kind, outside))
        if not outside and (alloc is None or step.settings.slack > alloc.slack):
          alloc = step.settings
    # The allocation's settings: the largest slack; its drafter's init is every program's (same drafter).
    self._alloc = dataclasses.replace(alloc, greedy=True, filtering=False)
    # The insert: the first token from a plain entry's resting iteration; a draft model's prefill deferred to the
    # row's first drafting step (served_draft.py: `Deferred`, woken by `step`).
    self._defers = served.insert is not None
    first = dataclasses.replace(self._alloc, drafter=served.insert) if self._defers else self._alloc
    self._first = {}
    for m in {self._insert_mode(m) for m in self.modes}:
      step = planner.plan(target, first.drafter, m, max_new_tokens=self.max_new_tokens, gamma=0, tree=None,
                          plain=True, rests=speculation is not None)
      self._first[m] = InsertProgram(first, step.settings, step.kind)
    # The most general mode's programs hold the most (its sampled distributions); the others need no planning.
    self._check_memory([settings for (_, mode), settings, _, _ in planned if mode == self.modes[-1]])
    self._positions = max(table.max_gamma, 1)  # G of the acceptance estimates
    self._layout, self._state = self._allocate()
    reachable = {}  # entry index -> the row buckets its active counts meet
    self._groups, per_group = data, self.slots // data
    for n in range(1, self.slots + 1):  # n active slots: max(ceil(n / D), ...) of them in the fullest group
      for fullest in range(-(-n // data), min(n, per_group) + 1):
        reachable.setdefault(table.index(n), set()).add(self._bucket(data * fullest))
    if self.budget is not None:  # the budget may pick any tier at any load
      reachable = {i: set().union(*reachable.values()) for i in range(len(table.entries))}
    for (i, mode), settings, kind, outside in planned:
      # A step of fewer rows than slots gathers their caches: one that needs less slack than the allocation (a
      # plain tier beside drafting ones) gathers only the positions its loop reaches, as a plain engine's.
      trim = self._alloc.slack - settings.slack
      # A plain step that leaves a lagging draft out is called without its state (`without_draft`).
      shardings = without_draft(self._state, self._layout.shardings)[1] if outside else self._layout.shardings
      for rows in sorted(reachable.get(i, ())):
        self._programs[(i, mode, rows)] = StepProgram(settings, kind, self.iterations_per_step, width, rows,
                                                      self._layout.axes, shardings, data,
                                                      estimates=self.budget is not None and not table.entries[i].plain,
                                                      draft_outside=outside,
                                                      keep=self._layout.kept(trim) if rows < self.slots else ())
    self._active = np.zeros((self.slots,), bool)
    self._stop = np.zeros((self.slots,), bool)
    self._requests: list[RequestSettings | None] = [None] * self.slots
    self._prompts: list[np.ndarray | None] = [None] * self.slots  # padded ids [1, bucket], length [1]
    self._quiet = np.zeros((self.slots,), bool)  # inserted without the draft's prefill, not yet woken
    # The host's copy of the acceptance estimates (est_sum, est_count), from each step's packed output.
    self._estimates = np.zeros((2, self.slots, self._positions), np.float32)
    self._estimates[:] = np.asarray([PRIOR_COUNT * PRIOR_ALPHA, PRIOR_COUNT], np.float32)[:, None, None]
    # A new request's prior: the served requests' acceptance (their verdicts, pooled when each one ends).
    self.acceptance = AcceptancePrior.start(self._positions)
    self._priors = np.full((self.slots, self._positions), PRIOR_ALPHA, np.float32)  # [S, G] each slot's insert's
    # The served steps' acceptance by a request's age, each row's verdicts' ages and its prior's (ages.py).
    self.age_curve = ages.AgeCurve.start(self._positions)
    self._own_ages = np.zeros((self.slots, ages.AGES))
    self._prior_ages = np.zeros((self.slots, ages.AGES))
    self._left = np.zeros((self.slots,), np.int64)  # tokens each active slot may still give (its max_tokens less
                                                    # those given): the budget's cap on a row's expected tokens
    self._last = None  # the previous step's program key (the budget learns from runs of one program)
    # Each slot's request by insert number, and those of the rows the previous step decoded: the stick weighs the
    # previous step's tier over about the same rows only (plan_step).
    self._serial = np.zeros((self.slots,), np.int64)
    self._inserts = 0
    self._last_rows = np.zeros((0,), np.int64)
    self._planned = None  # the program key plan_step() chose last (a step that runs it may refine its cost)
    self._ahead: Ahead | None = None  # the next step's tier, chosen while the last step ran (`_plan_ahead`)
    # Each row bucket's runs of plain decoding and drafting, and the probes of the tiers not run (probes.py).
    self._runs = SideRuns(share=self.budget.probe if self.budget is not None else 0.0)
    # Requests waiting for a slot (a server sets it: `set_queue`): with none, the slot of a row that ends in a step
    # stays empty through the next one, which the budget counts against long steps.
    self.queued = 0
    self._wake_cost = np.zeros((self.slots,), np.float64)  # seconds of its draft's prefill (CostCurves.wake at
                                                           # its prompt bucket; 0 without a deferred draft)
    self._max_tokens = np.zeros((self.slots,), np.int64)  # its request's max_tokens (with _left: tokens given)
    self._behind = np.zeros((self.slots,), bool)  # its draft rested (plain steps since it last drafted): the
                                                  # budget's next drafting step re-feeds it (CostCurves.catchup)

  # -- construction ------------------------------------------------------------------------------------------

  def _placement(self, rows: int) -> placement.Placement | None:
    """Where `rows` slots live: None on one device, else the mesh and the rules of the target's and the draft
    model's caches (as `generate` places a batch: `placement.plan`)."""
    return placement.plan(self.target, self._source.model, rows)

  def _check_memory(self, programs: list[loop.LoopSettings]) -> None:
    """CacheTooLargeError (one line naming --slots and the most slots that fit) when the slots' caches and state
    at the largest slack, and the widest step program, need more than a device's free memory (memory_guard)."""
    width = _buckets(self.max_input_length)[-1]
    buckets, data = self.row_buckets, (1 if self.mesh is None else dict(self.mesh.shape).get("data", 1))
    memory_guard.check_slots(programs, self._placement(self.slots), self.target, self._source, self.slots, width,
                             gathered=lambda n: _largest_below(buckets if n == self.slots else
                                                               _row_buckets(None, n, data, self._smallest), n))

  def _allocate(self) -> tuple[slot_programs.Layout, slot_programs.SlotState]:
    """The layout and the zero state of every slot, allocated where the slots live (slot_programs.allocate)."""
    return slot_programs.allocate(self._alloc, self.target_params, self.draft_params, self.slots,
                                  _buckets(self.max_input_length)[-1], self._placement(self.slots),
                                  positions=self._positions)

  def _global(self, *args):
    """Host arguments of a device program as they are on one process; with several processes (a mesh over every
    process's devices), each a global array replicated on the mesh (every process passes the same values)."""
    if self.mesh is None or jax.process_count() == 1:
      return args
    everywhere = NamedSharding(self.mesh, PartitionSpec())
    return tuple(place(np.asarray(x), everywhere) for x in args)

  # -- the interface ----------------------------------------------------------------------------------------

  @property
  def buckets(self) -> list[int]:
    return _buckets(self.max_input_length)

  def free_slots(self) -> list[int]:
    """The free slots, the one to fill first first: on a mesh, round-robin over the `data` groups from the least
    loaded (so that inserts in this order keep the groups even and a step gathers few rows from each)."""
    groups = self._active.reshape(self._groups, -1)
    order = []
    for g, row in enumerate(groups):
      free = np.flatnonzero(~row)
      order += [(int(row.sum()) + k, g, g * groups.shape[1] + int(s)) for k, s in enumerate(free)]
    return [s for _, _, s in sorted(order)]

  def active_slots(self) -> list[int]:
    return [int(i) for i in np.flatnonzero(self._active)]

  def _check_slot(self, slot) -> int:
    if not is_int(slot) or not 0 <= slot < self.slots:
      raise SettingsError(f"slot must be an integer in [0, {self.slots}), got {slot!r}.")
    return int(slot)

  def _check_prompt(self, prompt_ids) -> list[int]:
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, (Sequence, np.ndarray)):
      raise InputError(f"prompt_ids must be a sequence of token ids, got {type(prompt_ids).__name__}.")
    return arguments.check_ids(prompt_ids, "the prompt", self.target.config.vocab_size, self.max_input_length)

  def check_request(self, settings: RequestSettings) -> None:
    """Raises SettingsError when this engine cannot decode a request with `settings` (max_tokens above its
    max_new_tokens, a sampling mode it did not compile); `insert` checks it too."""
    if not isinstance(settings, RequestSettings):
      raise SettingsError(f"settings must be a RequestSettings, got {type(settings).__name__}.")
    sampling = settings.sampling
    if self._mode_for(sampling.mode) is None:
      raise SettingsError(f"this engine compiled the sampling modes {self.modes}: a request with temperature="
                          f"{sampling.temperature}, top_k={sampling.top_k}, top_p={sampling.top_p} needs "
                          f"{sampling.mode!r}.")
    if settings.max_tokens > self.max_new_tokens:
      raise SettingsError(f"max_tokens={settings.max_tokens} is more than this engine's max_new_tokens="
                          f"{self.max_new_tokens}.")

  def insert(self, slot: int, prompt_ids: Sequence[int], settings: RequestSettings) -> InsertOutput:
    """Prefills one request into a free `slot` and returns its first token (one compiled program per prompt bucket
    and insert mode; nothing recompiles): the target's prefill and one resting iteration of the row alone, so the
    token is ready before the next step. A draft model's prefill is deferred to the row's first drafting step
    (`step` wakes it). A request whose first token ends it (EOS, max_tokens 1, non-finite logits) is finished
    here and its slot is free again."""
    slot = self._check_slot(slot)
    if self._active[slot]:
      raise SettingsError(f"slot {slot} is busy: free it first (engine.free) or pick one of free_slots().")
    self.check_request(settings)
    ids = self._check_prompt(prompt_ids)
    bucket = arguments.bucket_length(len(ids), self.max_input_length)
    padded = np.full((1, bucket), self.pad_id, np.int32)
    padded[0, :len(ids)] = ids
    sampling, prior = settings.sampling, self.acceptance.alpha  # [G] where the row's estimates start and relax
    self._state, out = INSERT(self._first[self._insert_mode(sampling.mode)], self._layout, self.target_params,
                              self.draft_params, self._state,
                              *self._global(np.int32(slot), padded, np.asarray([len(ids)], np.int32),
                                            np.uint32(settings.seed), np.float32(sampling.temperature),
                                            np.int32(sampling.top_k), np.float32(sampling.top_p),
                                            np.int32(settings.max_tokens), np.bool_(settings.ignore_eos),
                                            np.int32(settings.min_tokens), prior))
    token, count, done, failed = (int(x) for x in jax.device_get(out))
    tokens = [token][:count]
    reason = None
    if done:
      ended_by_eos = tokens and tokens[-1] in self.eos_ids and not settings.ignore_eos
      reason = "error" if failed else "stop" if ended_by_eos else "length"
    self._active[slot], self._stop[slot] = not done, False
    self._requests[slot] = None if done else settings
    self._quiet[slot] = self._defers and not done
    self._prompts[slot] = (padded, np.asarray([len(ids)], np.int32)) if self._quiet[slot] else None
    self._priors[slot] = prior
    self._own_ages[slot], self._prior_ages[slot] = 0.0, self.age_curve.prior_ages
    self._estimates[0, slot], self._estimates[1, slot] = PRIOR_COUNT * self._priors[slot], PRIOR_COUNT
    self._left[slot] = 0 if done else settings.max_tokens - len(tokens)
    self._wake_cost[slot] = self.costs.wake.get(bucket, 0.0) if self._quiet[slot] else 0.0
    self._max_tokens[slot] = settings.max_tokens
    if done and not settings.ignore_eos:
      self.ends.observe(len(tokens), reason == "stop")
    self._behind[slot] = False
    self._inserts += 1
    self._serial[slot] = self._inserts
    return InsertOutput(tokens=tokens, reason=reason)

  def _insert_mode(self, needed: str) -> str:
    """The insert's sampling mode: greedy where compiled, else the most general compiled mode (a sampled row's
    draw in a "filtered" program with top_k 0 and top_p 1 is the "sampled" program's, bit for bit)."""
    return "greedy" if needed == "greedy" and "greedy" in self.modes else self.modes[-1]

  def free(self, slot: int) -> None:
    """Stops `slot` now (a stop string, a client gone): it decodes no more and is free for the next insert."""
    slot = self._check_slot(slot)
    if self._active[slot]:
      self._stop[slot] = True
      if not self._requests[slot].ignore_eos:  # a stop string, a client gone: an early end
        self.ends.observe(self._requests[slot].max_tokens - int(self._left[slot]), True)
      self._served(slot)
    self._active[slot], self._requests[slot] = False, None
    self._quiet[slot], self._prompts[slot] = False, None

  def _served(self, slot: int, tokens: int | None = None) -> None:
    """The request in `slot` ends: its verdicts join the served requests' acceptance (AcceptancePrior; under a
    budget: the estimates come back with each step only there); tokens: those it gave when it ran to its end
    (None: freed, cut short)."""
    if self.budget is not None:
      self.acceptance.observe(self._estimates[0, slot], self._estimates[1, slot], self._priors[slot], tokens)
      self.age_curve.finish(self._own_ages[slot])

  def _bucket(self, active: int) -> int:
    """The smallest row bucket holding `active` (>= 1) rows."""
    return next(b for b in self.row_buckets if b >= active)

  def _mode_for(self, needed: str) -> str | None:
    """The least general compiled mode that decodes a request needing `needed` exactly (None: none does)."""
    return next((m for m in self.modes if MODES.index(m) >= MODES.index(needed)), None)

  def plan_step(self) -> tuple[tuple[int, str, int], np.ndarray | None]:
    """The next step's choice from the host's view of the active slots: its program key (table entry, sampling
    mode, rows decoded: one of `programs`) and, under the verification budget, the per-slot draft limits [S] int32
    (each in [0, the tier's gamma], 0 for idle slots; None without a budget): the table entry for the number of
    active slots, or the budget's tier and limits from the slots' estimates and `costs`. `step()` runs exactly
    this; `step(program=key, limits=limits)` runs it on another process (hosts.Leader: process 0 decides).
    SettingsError when no slot is active (nothing to decode)."""
    if not self._active.any():
      raise SettingsError("plan_step: no slot is active (insert a request first): there is no step to plan.")
    active = [r for r in self._requests if r is not None]
    needed = max((r.sampling.mode for r in active), key=MODES.index)
    fullest = int(self._active.reshape(self._groups, -1).sum(axis=1).max())
    mode, rows = self._mode_for(needed), self._bucket(self._groups * fullest)
    if self.budget is None:
      return (self.table.index(len(active)), mode, rows), None
    # -- verification budget hook: the tier and the limits from the previous steps' estimates (budget.py) --
    slots = np.flatnonzero(self._active)
    ahead, self._ahead, runs = self._ahead, None, self._runs
    probed = runs.probing(rows)
    if probed is not None:  # a probe's later step: its tier again
      tier, chosen = self._tier_limits(slots, probed)
    elif ahead is not None and runs.home is None and ahead.holds(self._serial[slots], rows):  # chosen while the
      tier, chosen = self._tier_limits(slots, ahead.tier)  # last step ran, or a plain choice held (Budget.hold)
      if ahead.steps > 1:  # over about the rows of the step before, as the stick (`current`) holds
        self._ahead = dataclasses.replace(ahead, steps=ahead.steps - 1, requests=self._serial[slots])
    else:  # after a probe the stick weighs against the tier before it; over other rows, against none
      current = runs.current(None if self._last is None else self._last[0])
      if not same_rows(self._last_rows, self._serial[slots]):
        current = None
      after_plain = self._last is None or self.table.entries[self._last[0]].plain
      choice = self._choose(slots, rows, self._left[slots], self._behind[slots], current, after_plain)
      if choice.k == 0 and len(slots) == 1:  # a request alone: a first drafting step may pay (lookahead.py)
        choice = self._alone(int(slots[0]), rows, choice, sticks=current is not None)
      probe = runs.due(rows, choice, self._crossing(slots, rows, choice))
      if probe is not None:
        runs.start(rows, choice, probe, current)
        choice = probe
      elif self.budget.hold and (choice.k == 0 or (len(slots) == 1 and choice.k == self.table.entries[-1].gamma
                                                    and int(choice.limits[0]) == choice.k)):
        # Plain stands for the next plans (Budget.hold), a request alone's too (its estimates relax toward the prior
        # through plain steps, a few per cent a step); so does a request alone's widest tier drafted in full,
        # each held plan taking its limit from its estimates then (`_tier_limits`): nothing wider is compiled.
        self._ahead = Ahead(tier=choice.tier, requests=self._serial[slots], rows=rows, steps=self.budget.hold)
      tier, chosen = choice.tier, choice.limits
    limits = np.zeros((self.slots,), np.int32)
    limits[slots] = chosen
    self._planned = (tier, mode, rows)
    return self._planned, limits

  def _alone(self, slot: int, rows: int, choice: Choice, sticks: bool) -> Choice:
    """The plain `choice` for a request alone in `slot`, or its best drafting tier (`choice.other`) when the row
    has verified nothing and, over the last served requests that drafted, one drafting step and then each one's
    best tier takes less time than plain to its end (lookahead.drafts_first; by Budget.stick when `sticks`: the
    choice weighed the previous step's plain tier over the same row)."""
    beta_sum, count = self._estimates[:, slot]
    if observed(beta_sum, count, self._priors[slot])[1].max(initial=0.0) >= 1e-3:  # it verified some: its own
      return choice
    entries, request = self.table.entries, self._requests[slot]
    given = int(self._max_tokens[slot] - self._left[slot])
    if drafts_first(self.acceptance.recent, choice.other, [e.gamma for e in entries],
                    [self.costs.get(rows, e.gamma) for e in entries], self.budget.theta, self.iterations_per_step,
                    given, int(self._left[slot]), known_length=request.ignore_eos,
                    tree=[e.tree is not None for e in entries], stick=self.budget.stick if sticks else 0.0):
      return choice.other
    return choice

  def _tier_limits(self, slots: np.ndarray, tier: int) -> tuple[int, np.ndarray]:
    """(tier, [A] each row's draft limit) of a step of the given tier over the rows of `slots` [A], from their
    estimates now (`tier_limits`; none for a plain tier); plain (tier 0) when it is a chain tier nobody would draft
    in (as `choose` skips it: plain at a higher cost)."""
    entry = self.table.entries[tier]
    if entry.plain:
      return tier, np.zeros((len(slots),), np.int32)
    chosen = tier_limits(self._predicted(slots), entry.gamma, self.budget.theta, tree=entry.tree is not None)
    if not chosen.any() and self.table.entries[0].plain:
      return 0, chosen
    return tier, chosen

  def _choose(self, slots: np.ndarray, rows: int, left: np.ndarray, behind: np.ndarray,
              current: int | None, after_plain: bool) -> Choice:
    """The budget's choice (`budget.choose`) over the rows of `slots` [A] at row bucket `rows`: left [A] the
    tokens each may still give, behind [A] whose draft rested longer than gamma, current the tier the stick weighs
    against (None: none), after_plain whether the step before the one planned is plain (drafting then pays the
    return's settle, CostCurves.settle)."""
    entries = self.table.entries
    rate = self.ends.rate
    eos = np.asarray([not self._requests[s].ignore_eos for s in slots.tolist()])
    hazard = np.where(eos, rate, 0.0)
    remaining = self.ends.remaining(self._max_tokens[slots] - left, eos) if self.budget.lengths else None
    return choose(self._predicted(slots, left), [e.gamma for e in entries],
                  [self.costs.get(rows, e.gamma) for e in entries], self.budget.theta,
                  tree=[e.tree is not None for e in entries], left=left,
                  iterations=self.iterations_per_step, margin=self.budget.margin, behind=behind,
                  catchup=self.costs.catchup.get(rows, 0.0), hazard=hazard,
                  idle=self.budget.idle if self.queued == 0 and len(slots) > 1 else 0.0,
                  current=current, stick=self.budget.stick,
                  per_token=self._prefill_per_token(slots, left, hazard, remaining), remaining=remaining,
                  settle=self.costs.settle.get(rows, 0.0) if after_plain else 0.0)

  def _crossing(self, slots: np.ndarray, rows: int, choice: Choice) -> float:
    """The seconds a probe of the other side than `choice`'s pays once beyond its steps, over the rows of `slots`
    [A] at row bucket `rows`: the catch-up at R (the drafts rested through plain steps re-fed, by the probe's first
    step or by the return from it) and, from plain, the wakes of the quiet rows (any drafting step wakes them).
    From plain the catch-up counts only when some row's draft has rested: a request alone before its first plain
    step has nothing to re-feed; from drafting the return after the probe always re-feeds."""
    catchup = self.costs.catchup.get(rows, 0.0)
    if choice.k != 0:
      return catchup
    rested = bool(self._behind[slots].any())
    return (catchup if rested else 0.0) + float(self._wake_cost[slots][self._quiet[slots]].sum())

  def _plan_ahead(self, key: tuple[int, str, int], limits: np.ndarray) -> Ahead | None:
    """The next step's tier, chosen while this step (`key`, `limits` [S]) runs on the device: over the active rows
    expected to decode on after it (each gives its expected tokens of this step: I (1 + s(b, 1) + ... +
    s(b, limit_b))), their drafts behind unless they draft in it, from the estimates before it (plain: held for
    the next Budget.hold plans). None when every row is expected to end in it."""
    slots = np.flatnonzero(self._active)
    if not slots.size:
      return None
    chosen = limits[slots]
    left = self._left[slots] - self.iterations_per_step * per_row_rate(survival(self._predicted(slots)), chosen)
    going = left > 0
    if not going.any():
      return None
    slots, left = slots[going], left[going]
    choice = self._choose(slots, key[2], left, chosen[going] == 0, key[0], self.table.entries[key[0]].plain)
    # Plain chosen ahead stands for the next Budget.hold plans as a fresh plan's does (which then choose nothing
    # and plan nothing ahead): on a 2-core CPU a plan made ahead every step slows the step it overlaps.
    held = 1 + (self.budget.hold if choice.k == 0 else 0)  # the plan it is taken by, then the held ones
    return Ahead(tier=choice.tier, requests=self._serial[slots], rows=key[2], steps=held)

  def _prefill_per_token(self, slots: np.ndarray, left: np.ndarray, hazard: np.ndarray,
                         remaining: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray | None:
    """[A] the seconds of each row's draft prefill (its wake) per token of its request: CostCurves.wake at its
    prompt bucket over the tokens it buys. A woken row's is spread over its request's expected length (the tokens
    it gave, then those it is expected to give of its `left` [A] before it ends: `within` them at its chance of
    ending): the steady state, where each request that takes its slot is woken. A quiet row's wake is paid by the
    next drafting step and buys only the tokens it has left, so it is spread over those: a row woken halfway
    through its request pays twice the steady state's share (at 32 rows of the embedded pair a switch to drafting
    wakes every quiet row at once, 1-2 ms each). None without a deferred draft."""
    if not self._defers or not self.costs.wake:
      return None
    left = np.asarray(left, np.float64)
    ahead = within(left, hazard) if remaining is None else within_lengths(left, remaining)
    given = np.where(self._quiet[slots], 0.0, self._max_tokens[slots] - left)
    return self._wake_cost[slots] / np.maximum(given + ahead, 1.0)

  def set_queue(self, waiting: int) -> None:
    """The requests waiting for a free slot (the server's queue, which the scheduler sets before each step), for
    the verification budget's next choices (Budget.idle counts a finished row's slot as empty only when none
    waits)."""
    self.queued = max(0, int(waiting))

  def _predicted(self, slots: np.ndarray, left: np.ndarray | None = None) -> np.ndarray:
    """[A, G] the estimates of the rows of `slots` [A] carried to their ages (ages.predicted; the device's as
    they are with Budget.ages off): what the budget chooses from. left: [A] the tokens each may still give (the
    plan's; None: `_left`'s), their age the tokens given before them."""
    if not self.budget.ages:
      return self.estimates(slots)
    given = self._max_tokens[slots] - (self._left[slots] if left is None else left)
    return ages.predicted(*self._estimates[:, slots], self._priors[slots], self._own_ages[slots],
                          self._prior_ages[slots], given, self.age_curve)

  def estimates(self, slots: np.ndarray | None = None) -> np.ndarray:
    """[S, G] the host's copy of every slot's acceptance estimate per draft position (a(b, j); as the last step
    that decoded the slot left it, the prior after its insert): what the verification budget chooses from.
    slots: [A] int, only those slots' rows ([A, G]; the plan reads the active ones alone)."""
    beta_sum, count = self._estimates if slots is None else self._estimates[:, slots]
    return np.clip(beta_sum / np.maximum(count, 1e-6), 0.0, 1.0)

  @property
  def programs(self) -> tuple[tuple[int, str, int], ...]:
    """Every step program's key: (table entry index, sampling mode, rows decoded)."""
    return tuple(self._programs)

  def _known(self, program) -> bool:
    try:
      return isinstance(program, tuple) and program in self._programs
    except TypeError:  # unhashable parts
      return False

  def _rows(self, rows: int) -> np.ndarray:
    """[rows] int32 sorted slots to decode: every active slot, then idle ones (frozen) up to `rows`; on a mesh
    rows / D of each `data` group, from its own slots (`_take_rows`)."""
    per_group, index = self.slots // self._groups, []
    for g, row in enumerate(self._active.reshape(self._groups, -1)):
      active, idle = np.flatnonzero(row), np.flatnonzero(~row)[:rows // self._groups - int(row.sum())]
      index.append(g * per_group + np.sort(np.concatenate([active, idle])))
    return np.concatenate(index).astype(np.int32)

  def _check_limits(self, program, limits) -> np.ndarray:
    """`step`'s forced limits as [S] int32; SettingsError naming what is wrong with them."""
    if self.budget is None:
      raise SettingsError("limits: per-slot draft limits are the verification budget's, and this engine has none "
                          "(budget=False, a table or plain decoding).")
    if program is None:
      raise SettingsError("limits need the program they were chosen for: pass program= too (engine.plan_step() "
                          "gives both).")
    gamma = self.table.entries[program[0]].gamma
    try:
      array = np.asarray(limits)
    except (TypeError, ValueError):
      array = None
    if (array is None or array.shape != (self.slots,) or not np.issubdtype(array.dtype, np.integer)
        or array.min(initial=0) < 0 or array.max(initial=0) > gamma):
      shown = limits if array is None else array.tolist()  # a list's repr is one line, an array's may not be
      raise SettingsError(f"limits must be {self.slots} integers (one per slot) in [0, {gamma}] (the draft length of "
                          f"program {program!r}), got {shown!r}.")
    return array.astype(np.int32)

  def step(self, *, program: tuple[int, str, int] | None = None, limits: Sequence[int] | None = None
           ) -> StepOutput:
    """Runs <= iterations_per_step loop iterations over every active slot (one compiled program, one copy to the
    host) and frees the slots that finished. Without arguments it runs `plan_step()`'s choice.
    program: a key of `programs` to force one (warmup, tests, a follower replaying process 0's choice); under the
    verification budget every slot then drafts up to the tier's length unless limits says otherwise.
    limits: [S] ints, each in [0, the program's gamma]: the per-slot draft limits to run it with (only with a
    budget and a program: `plan_step()` gives both). Bad values: one SettingsError naming them."""
    n = self.slots
    if program is not None and not self._known(program):
      raise SettingsError(f"program must be one of engine.programs ((table entry, mode, rows) keys, e.g. "
                          f"{next(iter(self._programs))!r}), got {program!r}.")
    if limits is not None:
      limits = self._check_limits(program, limits)
    if not self._active.any() and program is None:
      zeros = np.zeros((n,), np.int64)
      return StepOutput(tokens=[[] for _ in range(n)], finished=np.zeros((n,), bool), reasons=[None] * n,
                        drafted=zeros, accepted=zeros.copy())
    key, limits = self.plan_step() if program is None else (program, limits)
    if self.budget is not None and limits is None:  # a forced program: every row drafts its tier's length
      limits = np.full((self.slots,), self.table.entries[key[0]].gamma, np.int32)
    woken = 0.0  # the seconds of the drafts prefilled here (run before the step, timed with it)
    plain = self.table.entries[key[0]].plain
    if not plain:
      quiet = np.flatnonzero(self._active & self._quiet)
      woken = float(self._wake_cost[quiet].sum())
      self._wake(quiet)
    prog = self._programs[key]
    stop = self._stop.copy()
    index = self._rows(prog.rows)
    # A plain tier's program takes no limits (all 0): carried through its loop unread, they cost a plain step at 4
    # rows 1-1.5 % on the embedded pair (docs/serving.md, twenty-second session).
    args = (stop, index) if limits is None or plain else (stop, index, limits[index])
    started = time.perf_counter()
    if prog.draft_outside:  # a lagging draft's state stays here, out of the plain step's call
      given, _ = without_draft(self._state)
      new, packed = STEP(prog, self.target_params, self.draft_params, given, *self._global(*args))
      self._state = dataclasses.replace(new, draft_state=self._state.draft_state)
    else:
      self._state, packed = STEP(prog, self.target_params, self.draft_params, self._state, *self._global(*args))
    self._stop[:] = False
    # The next step's tier, while the device runs this one: after a step the plan chose (not a follower's, not a
    # forced one, which drops what stood) of rows enough (Budget.ahead), unless a plain choice stands (Budget.hold).
    if limits is None or key != self._planned:
      self._ahead = None
    elif self._ahead is None and self.budget.ahead and np.count_nonzero(self._active) >= self.budget.ahead:
      self._ahead = self._plan_ahead(key, limits)
    packed_rows = np.asarray(jax.device_get(packed))
    seconds = time.perf_counter() - started
    self._last, self._last_rows = key, self._serial[index][self._active[index]]
    planned, self._planned = self._planned, None
    run = self._runs.ran(key[2], self.table.entries[key[0]].gamma, seconds)
    if prog.estimates:  # the rows' acceptance estimates, after the step's tokens and counts (the budget's)
      g = self._positions
      estimates = np.ascontiguousarray(packed_rows[:, packed_rows.shape[1] - 2 * g:]).view(np.float32)
      self._estimates[0, index], self._estimates[1, index] = estimates[:, :g], estimates[:, g:]
    elif self.budget is not None:  # a plain tier's: its iterations verified nothing, they relaxed the estimates
      self._estimates[:, index] = relaxed(*self._estimates[:, index], self._priors[index],
                                          packed_rows[:, prog.width + 5])
    packed = np.zeros((n, packed_rows.shape[1]), packed_rows.dtype)
    packed[index] = packed_rows
    w = prog.width
    tokens, counts, finished, failed = packed[:, :w], packed[:, w], packed[:, w + 1] > 0, packed[:, w + 2] > 0
    if limits is not None:
      # A step the plan chose that ran every iteration, re-fed no rested draft and followed a step of the same
      # row bucket and side (plain after plain, drafting after drafting, any tier; not a probe's first): its time
      # is the program's cost as served (beside the server's other work: the streaming of the previous step's
      # tokens, which a switch from plain to drafting or back would charge to this one), which moves the bucket's
      # curves (Budget.learn: the machine's speed), or a side's or a tier's alone (LEVEL_LEARN) as the first after
      # a run of the other side, or a probe's learnt step (the levels: probes.Run.levels).
      caught_up = bool(np.any((limits > 0) & self._behind & self._active))
      if (key == planned and self.budget.learn and not caught_up and run.learnt
          and packed[:, w + 5].max(initial=0) >= self.iterations_per_step):
        levels = run.levels
        self.costs.observe(prog.rows, self.table.entries[key[0]].gamma, seconds - woken,
                           LEVEL_LEARN if levels else self.budget.learn, levels=levels)
      # Rows that drafted caught up; active rows that did not fell behind.
      self._behind = np.where(limits > 0, False, self._behind | self._active)
    if prog.estimates:  # the step's verdicts by the age of each row's request (ages.py)
      given, drafted = self._max_tokens - self._left, np.where(self._active, packed[:, w + 3], 0)
      self.age_curve.observe(given, drafted, packed[:, w + 4],
                             None if limits is None or self.table.entries[key[0]].tree is not None else limits)
      self._own_ages = ages.own_ages(self._own_ages, given, drafted, packed[:, w + 5])
    self._left -= np.where(self._active, counts, 0)
    out_tokens, reasons = [], []
    for s in range(n):
      row = tokens[s, :counts[s]].tolist() if self._active[s] else []
      out_tokens.append(row)
      reason = None
      if finished[s] and self._active[s]:
        request = self._requests[s]
        ended_by_eos = row and row[-1] in self.eos_ids and not request.ignore_eos
        reason = "error" if failed[s] else "stop" if ended_by_eos else "length"
        if not request.ignore_eos:
          self.ends.observe(request.max_tokens - int(self._left[s]), reason == "stop")
        self._served(s, None if failed[s] else request.max_tokens - int(self._left[s]))  # an error: cut short
        self._active[s], self._requests[s] = False, None
      reasons.append(reason)
    finished = np.asarray([r is not None for r in reasons])
    return StepOutput(tokens=out_tokens, finished=finished, reasons=reasons, drafted=packed[:, w + 3],
                      accepted=packed[:, w + 4], entry=self.table.entries[key[0]], mode=key[1], rows=key[2],
                      limits=limits, iterations=packed[:, w + 5])

  def _wake(self, slots) -> None:
    """Prefills the draft of each slot in `slots` (active, inserted without it): the load fell to where the table
    drafts, and these rows draft from now on (one compiled program per prompt bucket)."""
    for slot in slots:
      padded, length = self._prompts[slot]
      self._state = WAKE(self._alloc, self._layout, self.draft_params, self._state,
                         *self._global(np.int32(slot), padded, length))
      self._quiet[slot], self._prompts[slot] = False, None

  def warmup(self) -> None:
    """Compiles every program: each bucket's insert and each step program (the engine is left idle)."""
    busy = self._active.any()
    if busy:
      raise SettingsError("warmup runs on an idle engine (before any insert).")
    for bucket, mode in itertools.product(self.buckets, sorted(self._first)):
      prompt = [self.pad_id] * bucket if bucket <= self.max_input_length else [self.pad_id]
      self.insert(0, prompt, RequestSettings(1, Sampling(0.0 if mode == "greedy" else 1.0)))  # ends there
      if self._defers:
        padded = (np.full((1, bucket), self.pad_id, np.int32), np.asarray([len(prompt)], np.int32))
        self._prompts[0] = padded
        self._wake([0])  # an idle row's draft: overwritten by the next insert
        if self.budget is not None and bucket not in self.costs.wake:  # the budget's per_token (choose)
          times = []
          for _ in range(self.budget.repeats):
            self._prompts[0] = padded
            started = time.perf_counter()
            self._wake([0])
            jax.block_until_ready(self._state)
            times.append(time.perf_counter() - started)
          self.costs.wake[bucket] = float(np.median(times))
      self.free(0)
    for key in self._programs:
      self.step(program=key)
      self._stop[:] = False
    if self.budget is not None:
      self._measure_costs()
    self.acceptance = AcceptancePrior.start(self._positions)  # warm-up's requests do not speak for the served
    self.age_curve = ages.AgeCurve.start(self._positions)  # nor do its steps (their rows repeat a pad token)
    self.ends.lengths = []  # nor its one-token requests' lengths (EndRate.remaining's count of the finished)

  def _measure_costs(self) -> None:
    """The verification budget's step-cost curves c(R, k) (`self.costs`): for every row bucket R, R requests
    inserted (a one-token prompt, max_new_tokens tokens, EOS ignored, in the first compiled mode; inserted again
    when they have too few tokens left for the next step), then 2 Budget.repeats rounds over the tiers (FEW_ROWS //
    R times as many at R < FEW_ROWS rows: the ratios of steps of a few milliseconds spread most, a gamma-4 step's
    to a plain one at 1 row on the embedded pair read 2.79, 3.16 and 3.39 in three warm-ups, and those rounds cost
    least), forward and reversed in turn (0, 1, 2, 4, then 4, 2, 1, 0): two steps of each drafting tier a round, the
    second timed (the first pays the switch from the program before, a drafting step's catch-up or wake), and four
    of plain, the fourth timed (`budget.settle_steps`: a plain step after drafting ones settles over three steps, 40 %,
    8-12 % and 3-4 % dearer at 4 and 8 rows on the embedded pair, docs/bench/serving/plain_settle.log; timed at its
    second, plain read up to a sixth dearer than served and drafting that much cheaper against it). The rounds'
    timings make c(R, k) (`budget.curves_from_rounds`: plain's median, times the median over the rounds of each
    tier's ratio to its round's plain step), so a slow spell of the machine, which shifts a round's steps together,
    leaves the ratios the choice weighs at R. Plain's settle at R (`costs.settle`: the median, over the rounds where
    plain follows a drafting tier, of its three untimed steps' excess over three of its timed one), what a return
    from drafting pays. Then the catch-up at R (`_measure_catchup`).
    Rows that run out of tokens leave a round's timing out (an engine of a few max_new_tokens). What runs depends
    on the engine's settings and the steps' token counts only, never on a timing: over several processes every
    process runs the same programs in the same order (each times its own; only process 0's curves choose:
    `plan_step` runs there alone)."""
    mode, repeats = self.modes[0], self.budget.repeats
    settings = RequestSettings(self.max_new_tokens, Sampling(0.0 if mode == "greedy" else 1.0), ignore_eos=True)
    for rows in self.row_buckets:
      tiers = [(i, e) for i, e in enumerate(self.table.entries) if (i, mode, rows) in self._programs]
      slots, left = [], 0
      count = 2 * repeats * max(1, FEW_ROWS // rows)
      rounds = {entry.gamma: [None] * count for _, entry in tiers}
      settles, drafted = [], False  # plain's settle after a drafting step: its first steps' excess over its timed one
      for r in range(count):
        for i, entry in (tiers if r % 2 == 0 else tiers[::-1]):
          untimed = settle_steps(entry.gamma)  # a step right after another program costs more (a plain one for three)
          if not slots or left < (untimed + 1) * self.iterations_per_step * (entry.gamma + 1):
            for slot in slots:
              self.free(slot)
            slots, left, drafted = self.free_slots()[:rows], self.max_new_tokens - 1, False
            for slot in slots:
              self.insert(slot, [self.pad_id], settings)
          times = []
          for n in range(untimed + 1):
            if not self._active[slots].all():
              break
            started = time.perf_counter()
            out = self.step(program=(i, mode, rows))
            times.append(time.perf_counter() - started)
            if n == untimed:
              rounds[entry.gamma][r] = times[-1]
            left -= max(len(out.tokens[s]) for s in slots)
          if entry.plain and drafted and len(times) == untimed + 1:
            settles.append(sum(times[:-1]) - untimed * times[-1])
          drafted = not entry.plain
      self.costs.seconds.update({(rows, k): v for k, v in curves_from_rounds(rounds).items()})
      if settles:
        self.costs.settle[rows] = max(0.0, float(np.median(settles)))
      for slot in slots:
        self.free(slot)
      self._measure_catchup(rows, mode, settings)
    # A catch-up re-feeds more drafts at more rows: a bucket's is at most a larger one's (a spike in one bucket's
    # timing, 7.9 ms at 4 rows between 2.1 at 2 and 4.1 at 8 on the embedded pair, had the budget charge every
    # return to drafting there so much that it stayed plain where the fixed gamma was 1.2x plain).
    lowest = float("inf")
    for rows in sorted(self.costs.catchup, reverse=True):
      lowest = self.costs.catchup[rows] = min(self.costs.catchup[rows], lowest)

  def _measure_catchup(self, rows: int, mode: str, settings: RequestSettings) -> None:
    """`costs.catchup[rows]`: R fresh rows decode two plain steps (their drafts rest longer than gamma), one step
    of the narrowest drafting tier (untimed: its first catch-up), two plain steps again, then that tier's step
    timed; Budget.repeats times, the median less its c(R, k) is the catch-up. Skipped (0) when max_new_tokens is
    too short for it."""
    entries = self.table.entries
    k = next((i for i, e in enumerate(entries) if not e.plain and (i, mode, rows) in self._programs), None)
    plain = (0, mode, rows)
    if k is None or not entries[0].plain or plain not in self._programs or (rows, entries[k].gamma) not in \
        self.costs.seconds:
      return
    if 2 * (4 + entries[k].gamma + 1) * self.iterations_per_step > self.max_new_tokens - 1:
      return
    times = []
    for _ in range(self.budget.repeats):
      slots = self.free_slots()[:rows]
      for slot in slots:
        self.insert(slot, [self.pad_id], settings)
      for key in (plain, plain, (k, mode, rows), plain, plain):
        self.step(program=key)
      started = time.perf_counter()
      self.step(program=(k, mode, rows))
      times.append(time.perf_counter() - started)
      for slot in slots:
        self.free(slot)
    self.costs.catchup[rows] = max(0.0, float(np.median(times)) - self.costs.seconds[(rows, entries[k].gamma)])

  def compiled_programs(self) -> int:
    """Programs compiled so far by every engine (step, insert and wake jits): a test of "nothing recompiles" reads it."""
    return slot_programs.compiled_count()
