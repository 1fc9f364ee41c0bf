"""The verification budget's plan inside the decode loop: what `SlotEngine.plan_step` (and `budget.choose` within
it) costs right after each step's device work, on the embedded pair, at a few concurrencies (issue 39).

    .venv/bin/python docs/bench/serving/plan_cost.py --concurrency=1,4,8,16 --output=docs/bench/serving/plan_cost

One budget engine (64 slots, greedy, 64 new tokens, the served workload's prompts), warmed up, then per
concurrency C a closed loop of --requests requests (C in flight; each finished one replaced before the next step)
with `plan_step` and `choose` timed inside `step`. A plan repeated alone costs a fraction of this (its caches
warm): only the in-loop figure is what a step pays. Per C: the medians, and the plan's share of the loop's wall
time. Writes OUTPUT.md (a table) and OUTPUT.json. Nothing else should run meanwhile.
"""

from __future__ import annotations

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
REQUESTS = flags.DEFINE_integer("requests", 96, "requests per concurrency")
OUTPUT = flags.DEFINE_string("output", None, "OUTPUT.md and OUTPUT.json (None: print only)")
WORKLOAD = "docs/bench/serving_ende.jsonl"


def main(_):
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  with open(WORKLOAD, encoding="utf-8") as f:
    prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
  settings = RequestSettings(64, jaxspec.Sampling(0.0))
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64,
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
  rows = []
  for c in (int(v) for v in CONCURRENCY.value):
    plans.clear()
    chooses.clear()
    sent, steps, start = 0, 0, time.perf_counter()
    while sent < REQUESTS.value or engine.active_slots():
      while sent < REQUESTS.value and len(engine.active_slots()) < c:
        engine.insert(engine.free_slots()[0], prompts[sent % len(prompts)], settings)
        sent += 1
      engine.step()
      steps += 1
    wall = time.perf_counter() - start
    rows.append({"concurrency": c, "steps": steps, "plan_ms": 1e3 * float(np.median(plans)),
                 "choose_ms": 1e3 * float(np.median(chooses)), "step_ms": 1e3 * wall / steps,
                 "plan_share": float(np.sum(plans) / wall)})
    print(rows[-1], flush=True)
  table = markdown_table(["concurrency", "steps", "plan_step (median)", "choose (median)", "loop time a step",
                          "plan's share"],
                         [[r["concurrency"], r["steps"], f"{r['plan_ms']:.3f} ms", f"{r['choose_ms']:.3f} ms",
                           f"{r['step_ms']:.2f} ms", f"{100 * r['plan_share']:.2f} %"] for r in rows])
  print("\n".join(table))
  if OUTPUT.value:
    atomic_write(OUTPUT.value + ".md", "\n".join(table) + "\n")
    atomic_write_json(OUTPUT.value + ".json", {"rows": rows, "jax": jax.__version__, "requests": REQUESTS.value},
                      indent=1)


if __name__ == "__main__":
  app.run(main)
