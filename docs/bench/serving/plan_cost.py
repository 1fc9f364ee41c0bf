"""The verification budget's plan inside the decode loop: what `SlotEngine.plan_step` (and `budget.choose` within
it) costs between two steps' device work, on the embedded pair, at a few concurrencies, with and without the
next step's tier chosen while a step runs (Budget.ahead; issue 39).

    .venv/bin/python docs/bench/serving/plan_cost.py --concurrency=1,4,8,16 --ahead=0,8 --rounds=2 \
        --output=docs/bench/serving/plan_cost

One budget engine (--slots slots, greedy, 64 new tokens, the served workload's prompts), warmed up, then per round,
concurrency C and Budget.ahead value (their order reversed every other round) a closed loop of --requests requests
(C in flight; each finished one replaced before the next step) with `plan_step` (the host's plan before a step)
and `choose` (wherever it runs: in `plan_step`, or during a step's device work when planned ahead) timed. A plan
repeated alone costs a fraction of this (its caches warm): only the in-loop figure is what a step pays. Per C and
ahead value, pooled over the rounds: the medians and means, the loop's wall time per step, and the plan's share of
it. Writes OUTPUT.md (a table) and OUTPUT.json. Nothing else should run meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import numpy as np
from absl import app, flags

import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine
from jaxspec.serving import engine as engine_module
from jaxspec.tools.outputs import atomic_write, atomic_write_json, markdown_table

CONCURRENCY = flags.DEFINE_list("concurrency", ["1", "4", "8", "16"], "requests in flight")
AHEAD = flags.DEFINE_list("ahead", ["0", "8"], "Budget.ahead values to compare (0: every plan between steps)")
REQUESTS = flags.DEFINE_integer("requests", 96, "requests per concurrency, ahead value and round")
ROUNDS = flags.DEFINE_integer("rounds", 2, "rounds (the ahead values' order reversed every other one)")
SLOTS = flags.DEFINE_integer("slots", 64, "the engine's slots (at least the largest concurrency)")
OUTPUT = flags.DEFINE_string("output", None, "OUTPUT.md and OUTPUT.json (None: print only)")
WORKLOAD = "docs/bench/serving_ende.jsonl"


def main(_):
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  with open(WORKLOAD, encoding="utf-8") as f:
    prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
  settings = RequestSettings(64, jaxspec.Sampling(0.0))
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=SLOTS.value, max_input_length=64,
                      max_new_tokens=64, modes=("greedy",), budget=Budget())
  engine.warmup()
  plans, chooses = [], []
  plan, choose = engine.plan_step, engine_module.choose

  def timed_plan():
    start = time.perf_counter()
    out = plan()
    plans.append(time.perf_counter() - start)
    return out

  def timed_choose(*args, **kwargs):
    start = time.perf_counter()
    out = choose(*args, **kwargs)
    chooses.append(time.perf_counter() - start)
    return out

  engine.plan_step, engine_module.choose = timed_plan, timed_choose
  aheads = [int(v) for v in AHEAD.value]
  pooled = {}
  for r in range(ROUNDS.value):
    for c in (int(v) for v in CONCURRENCY.value):
      for ahead in (aheads if r % 2 == 0 else aheads[::-1]):
        engine.budget = dataclasses.replace(engine.budget, ahead=ahead)
        plans.clear()
        chooses.clear()
        sent, steps, start = 0, 0, time.perf_counter()
        while sent < REQUESTS.value or engine.active_slots():
          while sent < REQUESTS.value and len(engine.active_slots()) < c:
            engine.insert(engine.free_slots()[0], prompts[sent % len(prompts)], settings)
            sent += 1
          engine.step()
          steps += 1
        cell = pooled.setdefault((c, ahead), {"plans": [], "chooses": [], "wall": 0.0, "steps": 0})
        cell["plans"] += plans
        cell["chooses"] += chooses
        cell["wall"] += time.perf_counter() - start
        cell["steps"] += steps
        print(r, c, ahead, f"{1e3 * float(np.mean(plans)):.3f} ms plan", flush=True)
  rows = []
  for (c, ahead), cell in pooled.items():
    rows.append({"concurrency": c, "ahead": ahead, "steps": cell["steps"], "chooses": len(cell["chooses"]),
                 "plan_ms": 1e3 * float(np.median(cell["plans"])), "plan_mean_ms": 1e3 * float(np.mean(cell["plans"])),
                 "choose_ms": 1e3 * float(np.median(cell["chooses"])),
                 "step_ms": 1e3 * cell["wall"] / cell["steps"],
                 "plan_share": float(np.sum(cell["plans"]) / cell["wall"])})
  rows.sort(key=lambda row: (row["concurrency"], row["ahead"]))
  table = markdown_table(["concurrency", "ahead", "steps", "choose calls", "plan_step median / mean",
                          "choose (median)", "loop time a step", "plan's share"],
                         [[r["concurrency"], r["ahead"], r["steps"], r["chooses"],
                           f"{r['plan_ms']:.3f} / {r['plan_mean_ms']:.3f} ms", f"{r['choose_ms']:.3f} ms",
                           f"{r['step_ms']:.2f} ms", f"{100 * r['plan_share']:.2f} %"] for r in rows])
  print("\n".join(table))
  if OUTPUT.value:
    atomic_write(OUTPUT.value + ".md", "\n".join(table) + "\n")
    atomic_write_json(OUTPUT.value + ".json", {"rows": rows, "jax": jax.__version__, "requests": REQUESTS.value,
                                               "rounds": ROUNDS.value, "slots": SLOTS.value}, indent=1)


if __name__ == "__main__":
  app.run(main)
