"""The verification budget, a fixed gamma and plain decoding in ONE process, level by level: the arms' engines
side by side (sharing the models), their order alternating per round, no HTTP (issue 39).

    .venv/bin/python docs/bench/serving/arms_in_process.py --output=docs/bench/serving/arms_ende
    .venv/bin/python docs/bench/serving/arms_in_process.py --pair=qwen --target=DIR --draft=DIR --concurrency=4 \
        --slots=4 --requests=16 --rounds=2 --arms=budget,fixed --output=docs/bench/serving/arms_qwen_c4
    .venv/bin/python docs/bench/serving/arms_in_process.py --pair=qwen --target=DIR --draft=DIR --concurrency=16,32 \
        --slots=32 --row_buckets=16,32 --requests=32 --rounds=2 --arms=budget,plain \
        --output=docs/bench/serving/arms_qwen_c16_c32

A served grid (grid.sh, final_restarts.sh) compares server processes, whose speeds differ by a few per cent from
process to process and run to run; here every arm runs in the same process, so what differs is the engines' own
work: their step programs, the budget's plan and choices. Per level C and arm a closed loop of --requests greedy
requests (C in flight, each finished one replaced before the next step) per round; tokens per second over the rounds, the
steps each arm ran per draft length, and each arm's ratio to the last arm listed. With --slice=N the arms' loops of
a round run side by side, N steps of one arm, then N of the next (timed each), in turn: this project's VMs change
speed by up to 2x within minutes (a plain arm's rounds at concurrency 1 read 344, 345, 200 and 247 tok/s in one
run), and a round an arm ran alone took its own spell of the machine, which moved the ratios by a tenth from run to
run; in slices of a second or so every arm shares each spell. A slice's first step follows another engine's
(about a tenth dearer: docs/bench/serving/switch_cost.md), 1 / N of the steps in every arm alike. The embedded pair: 64 new
tokens, the served workload's prompts (docs/bench/serving_ende.jsonl); the Qwen pair (--target / --draft: the
converted Qwen2.5-Coder 1.5B / 0.5B directories): 48 new tokens, the chat prompts of docs/bench/qwen_prompts.jsonl.
Writes OUTPUT.md and OUTPUT.json. Nothing else should run meanwhile.

Each arm's ratio to the base comes with a 90 % interval from its rounds: every round serves the same requests in
every arm, so the per-round ratios are paired, and the interval is Student's t on their logarithms (rounds - 1
degrees of freedom) around their geometric mean. At concurrency 64, where the budget and plain ran the same plain
steps, single rounds read 0.90-1.14 of plain: the interval says how far a ratio is from 1 by this machine's
noise alone. --summarize=RUN.json prints a committed run's table with the intervals, running nothing. A budget arm
also counts the probes it started (probes.SideRuns: two steps each of a tier its choice did not pick).

--cost_model=LOG (a log with a budget's warm-up curves, as this script or launch/serve.py prints them) runs no
warm-up and charges every step from those curves on a fake clock (model_clock.py): the engines decode for real and
the budget's rules run as served, but the ratios are what the rules give on this workload's acceptance at those
costs, without the machine's noise or the host's work (one round suffices: nothing varies between rounds but the
prompts).

    .venv/bin/python docs/bench/serving/arms_in_process.py --cost_model=docs/bench/serving/arms_ende_s69_amd_c1_c4.log \
        --rounds=1 --requests=48 --output=docs/bench/serving/arms_ende_model_amd
"""

from __future__ import annotations

import collections
import copy
import json
import math
import statistics
import time

import jax
from absl import app, flags
from scipy import stats

import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine
from jaxspec.tools.outputs import atomic_write, atomic_write_json, markdown_table

import model_clock  # pylint: disable=wrong-import-position  (beside this script)

PAIR = flags.DEFINE_enum("pair", "ende", ["ende", "qwen"], "the embedded EN-DE pair or the Qwen pair")
TARGET = flags.DEFINE_string("target", None, "the Qwen target's directory (--pair=qwen)")
DRAFT = flags.DEFINE_string("draft", None, "the Qwen draft's directory (--pair=qwen)")
CONCURRENCY = flags.DEFINE_list("concurrency", ["1", "4", "8", "16", "32", "64"], "requests in flight, per level")
SLOTS = flags.DEFINE_integer("slots", 64, "the engines' slots")
REQUESTS = flags.DEFINE_integer("requests", 128, "requests per arm and round")
ROUNDS = flags.DEFINE_integer("rounds", 4, "rounds (the arms' order reversed every other round)")
SLICE = flags.DEFINE_integer("slice", 0, "steps an arm runs before the next arm's turn within a round (0: each arm "
                             "runs its whole round in turn)")
ROW_BUCKETS = flags.DEFINE_list("row_buckets", None, "the engines' row buckets (None: the engine's default); e.g. "
                                "16,32 for levels 16 and 32 alone: fewer programs to compile and time in warm-up")
ARMS = flags.DEFINE_list("arms", ["budget", "fixed", "plain"],
                        "budget, noprobe (the budget without probes), ahead1 (the budget planning ahead at any "
                        "number of rows), margin5 (the budget with Budget.margin 0.05, on the budget arm's warm-up "
                        "curves when both run), nosettle (the budget whose choice leaves plain's settle out, "
                        "CostCurves.settle, on the budget arm's warm-up curves when both run), hold0 (the budget "
                        "with Budget.hold 0: every plan chooses, on the budget arm's curves), noages (the budget "
                        "on the device's estimates as they are: Budget.ages off), nolengths (Budget.lengths off: one "
                        "hazard a token), before29 (both off: the twenty-eighth session's budget), tiers04 "
                        "(the budget with the tiers 0 and 4 alone), fixed (gamma 4), "
                        "fixed_i2 / fixed_i1 (gamma 4 at 2 / 1 loop iterations a step), fixed2_i2 (gamma 2 at 2), "
                        "plain_i2 (plain at 2), "
                        "plain, plain2 (a second plain engine: the harness's floor); the last is the base")
OUTPUT = flags.DEFINE_string("output", None, "OUTPUT.md and OUTPUT.json (None: print only)")
SUMMARIZE = flags.DEFINE_string("summarize", None, "a run's JSON: print its table with the intervals, run nothing")
COST_MODEL = flags.DEFINE_string("cost_model", None, "a log with a budget's warm-up curves: every step is charged "
                                 "from them on a fake clock, not timed (model_clock.py), and no warm-up runs")


def _workload():
  """(target, draft, prompts as token ids, new tokens, max input length)."""
  if PAIR.value == "ende":
    target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
    with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
      prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
    return target, draft, prompts, 64, 64
  target, draft = jaxspec.load(TARGET.value), jaxspec.load(DRAFT.value)
  tokenizer = target.tokenizer
  with open("docs/bench/qwen_prompts.jsonl", encoding="utf-8") as f:
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(json.loads(line)["messages"])) for line in f]
  return target, draft, prompts, 48, 128


class _Loop:
  """One arm's closed loop over a round: `requests` greedy requests (REQUESTS of `prompts`, in order), `c` in
  flight, each finished one replaced before the next step; the tokens it made and the seconds its turns took."""

  def __init__(self, engine: SlotEngine, prompts: list, c: int, settings: RequestSettings, clock=time.perf_counter):
    self.engine, self.prompts, self.c, self.settings, self.clock = engine, prompts, c, settings, clock
    self.sent = self.made = 0
    self.seconds = 0.0

  @property
  def done(self) -> bool:
    return self.sent >= REQUESTS.value and not self.engine.active_slots()

  def run(self, steps: int | None, counts: collections.Counter) -> None:
    """Up to `steps` steps (None: to the round's end), inserts before each; counts: steps by draft length."""
    engine, start, ran = self.engine, self.clock(), 0
    while not self.done and (steps is None or ran < steps):
      while self.sent < REQUESTS.value and len(engine.active_slots()) < self.c:
        prompt = self.prompts[self.sent % len(self.prompts)]
        self.made += len(engine.insert(engine.free_slots()[0], prompt, self.settings).tokens)
        self.sent += 1
      out = engine.step()
      self.made += sum(len(t) for t in out.tokens)
      counts[out.entry.gamma if out.entry is not None else 0] += 1
      ran += 1
    self.seconds += self.clock() - start


def _count_probes(engines: dict) -> collections.Counter:
  """Per budget arm, the probes its engine starts from now on (each two steps of a tier the choice did not pick:
  probes.SideRuns), counted by wrapping its SideRuns.start."""
  counts = collections.Counter()
  for arm, engine in engines.items():
    if engine.budget is None:
      continue
    runs = engine._runs  # pylint: disable=protected-access
    start = type(runs).start
    def counted(rows, choice, probe, home, arm=arm, runs=runs, start=start):
      counts[arm] += 1
      start(runs, rows, choice, probe, home)
    runs.start = counted
  return counts


def interval(ratios: list[float], level: float = 0.9) -> tuple[float, float, float]:
  """(geometric mean, low, high) of paired per-round ratios: Student's t interval at `level` on their logarithms
  (one round: no interval, (r, nan, nan))."""
  logs = [math.log(r) for r in ratios]
  mean = statistics.fmean(logs)
  if len(logs) < 2:
    return math.exp(mean), math.nan, math.nan
  half = stats.t.ppf(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
  return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _table(run: dict, base: str) -> list[str]:
  """A run's markdown table (`run`: the JSON this script writes), each arm's ratio to `base` with its rounds'
  interval."""
  rounds = {(r["concurrency"], r["arm"]): r["round_tokens_per_s"] for r in run["rows"]}
  cells = []
  for r in run["rows"]:
    paired = [a / b for a, b in zip(r["round_tokens_per_s"], rounds[(r["concurrency"], base)])]
    _, low, high = interval(paired)
    cells.append([r["concurrency"], r["arm"], f"{r['tokens_per_s']:.2f}", f"{r['ratio']:.3f}",
                  "" if r["arm"] == base or math.isnan(low) else f"{low:.3f}-{high:.3f}", r["steps_by_gamma"],
                  r.get("probes", "")])
  buckets = "" if run["row_buckets"] is None else f" (row buckets {','.join(run['row_buckets'])})"
  sliced = f", in slices of {run['slice']} steps" if run["slice"] else ""
  if run.get("cost_model"):
    sliced += f", steps charged from the cost model of {run['cost_model']} (model_clock.py), not timed"
  table = [f"{run['pair']} pair, {run['slots']} slots{buckets}, {run['rounds']} rounds of {run['requests']} requests "
           f"an arm and level{sliced}, one process", ""]
  return table + markdown_table(["concurrency", "arm", "tokens/s", f"/ {base}", "90 % interval (rounds)",
                                 "steps by draft length", "probes"], cells)


def main(_):
  if SUMMARIZE.value:
    with open(SUMMARIZE.value, encoding="utf-8") as f:
      run = json.load(f)
    print("\n".join(_table(run, run["rows"][-1]["arm"])))
    return
  target, draft, prompts, new_tokens, max_input = _workload()
  speculation = jaxspec.Speculation(draft, gamma=4)
  kinds = {"budget": (speculation, Budget()), "fixed": (speculation, False), "plain": (None, False),
           "noprobe": (speculation, Budget(probe=0.0)),  # the budget without its probes (probes.py)
           "ahead1": (speculation, Budget(ahead=1)),  # every step's next tier chosen while it runs
           "margin5": (speculation, Budget(margin=0.05)), "nosettle": (speculation, Budget()),
           "hold0": (speculation, Budget(hold=0)),  # every plan chooses afresh (no held plain choice)
           "noages": (speculation, Budget(ages=False)),  # the device's estimates as they are (no ages.py)
           "nolengths": (speculation, Budget(lengths=False)),  # one hazard a token (no EndRate.remaining)
           "before29": (speculation, Budget(ages=False, lengths=False)),  # the twenty-eighth session's budget
           "tiers04": (speculation, Budget(tiers=(4,))),  # plain and gamma 4 alone (no gamma-1 or gamma-2 tier)
           "plain2": (None, False), "fixed_i2": (speculation, False), "fixed_i1": (speculation, False),
           "plain_i2": (None, False), "fixed2_i2": (jaxspec.Speculation(draft, gamma=2), False)}
  iterations = {"fixed_i2": 2, "fixed_i1": 1, "plain_i2": 2, "fixed2_i2": 2}  # loop iterations a step (else 4)
  engines = {arm: SlotEngine(target, kinds[arm][0], slots=SLOTS.value, max_input_length=max_input,
                             max_new_tokens=new_tokens, modes=("greedy",), budget=kinds[arm][1],
                             iterations_per_step=iterations.get(arm, 4),
                             row_buckets=None if ROW_BUCKETS.value is None else [int(b) for b in ROW_BUCKETS.value])
             for arm in ARMS.value}
  clock = time.perf_counter
  if COST_MODEL.value:  # the choice rules alone: steps charged from the curves, which every budget chooses by
    model = model_clock.ModelClock(model_clock.read_curves(COST_MODEL.value))
    model.install(engines.values())
    clock = model.perf_counter
  else:
    for engine in engines.values():
      engine.warmup()
  for arm in ("margin5", "nosettle", "hold0"):  # they then differ by the margin / the settle / the hold alone, not
    # by two warm-ups
    if arm in engines and "budget" in engines:
      engines[arm].costs = copy.deepcopy(engines["budget"].costs)
  if "nosettle" in engines:
    engines["nosettle"].costs.settle.clear()
  for arm, engine in engines.items():
    if engine.budget is not None:  # the curves it chooses by, as the server prints them
      source = f"the cost model ({COST_MODEL.value})" if COST_MODEL.value else "measured in warm-up"
      print(f"{arm}: step costs {source}:\n  " + "\n  ".join(engine.costs.lines()), flush=True)
  settings = RequestSettings(new_tokens, jaxspec.Sampling(0.0))
  base, rows = ARMS.value[-1], []
  for c in (int(v) for v in CONCURRENCY.value):
    seconds, tokens = collections.Counter(), collections.Counter()
    steps = {arm: collections.Counter() for arm in engines}
    probes = _count_probes(engines)
    rounds = {arm: [] for arm in engines}
    for r in range(ROUNDS.value):
      order = ARMS.value if r % 2 == 0 else ARMS.value[::-1]
      offset = r * REQUESTS.value % len(prompts)  # each round its own prompts, the same in every arm
      loops = {arm: _Loop(engines[arm], prompts[offset:] + prompts[:offset], c, settings, clock)
               for arm in order}
      while any(not loop.done for loop in loops.values()):
        for arm in order:
          loops[arm].run(SLICE.value or None, steps[arm])
      for arm in order:
        loop = loops[arm]
        seconds[arm] += loop.seconds
        tokens[arm] += loop.made
        rounds[arm].append(loop.made / loop.seconds)
        print(f"c={c} round {r} {arm}: {loop.made / loop.seconds:.1f} tok/s", flush=True)
    rows += [{"arm": arm, "concurrency": c, "tokens_per_s": tokens[arm] / seconds[arm],
              "ratio": (tokens[arm] / seconds[arm]) / (tokens[base] / seconds[base]),
              "round_tokens_per_s": rounds[arm], "steps_by_gamma": dict(sorted(steps[arm].items())),
              "probes": probes[arm]}
             for arm in engines]
  for arm, engine in engines.items():
    if engine.budget is not None:  # where the served steps and probes moved them
      print(f"{arm}: step costs after serving:\n  " + "\n  ".join(engine.costs.lines()), flush=True)
  run = {"pair": PAIR.value, "slots": SLOTS.value, "row_buckets": ROW_BUCKETS.value, "requests": REQUESTS.value,
         "rounds": ROUNDS.value, "slice": SLICE.value, "jax": jax.__version__, "cost_model": COST_MODEL.value,
         "rows": rows}
  table = _table(run, base)
  print("\n".join(table))
  if OUTPUT.value:
    atomic_write(OUTPUT.value + ".md", "\n".join(table) + "\n")
    atomic_write_json(OUTPUT.value + ".json", run, indent=1)


if __name__ == "__main__":
  app.run(main)
