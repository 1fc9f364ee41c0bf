"""What a step costs right after a step of another program (issue 39: why warm-up times the second of two steps).

    .venv/bin/python docs/bench/serving/switch_cost.py --output=docs/bench/serving/switch_cost

One engine under the budget (the embedded pair, gamma 4, 64 slots, row buckets 8 and 64) warms up; then --repeats
times, 8 fresh rows (a one-token prompt, EOS ignored) run the step programs gamma 4, plain, plain, gamma 4, gamma
4 at 8 rows, each step timed. Per pair (the program before, the program timed): the median and mean seconds. A
plain step after a plain one against one after a gamma-4 step is what a switch adds; gamma 4 after plain also
holds the drafts' catch-up. Writes OUTPUT.md and OUTPUT.json. Nothing else should run meanwhile.
"""

from __future__ import annotations

import collections
import time

import jax
import numpy as np
from absl import app, flags

import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine
from jaxspec.tools.outputs import atomic_write, atomic_write_json, markdown_table

REPEATS = flags.DEFINE_integer("repeats", 40, "sequences of steps")
OUTPUT = flags.DEFINE_string("output", None, "OUTPUT.md and OUTPUT.json (None: print only)")


def main(_):
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64, max_new_tokens=64,
                      modes=("greedy",), budget=Budget(repeats=1), row_buckets=[8, 64])
  engine.warmup()
  settings = RequestSettings(64, jaxspec.Sampling(0.0), ignore_eos=True)
  plain, gamma4 = (0, "greedy", 8), (len(engine.table.entries) - 1, "greedy", 8)
  names = {plain: "plain", gamma4: "gamma 4"}
  times = collections.defaultdict(list)
  for _ in range(REPEATS.value):
    slots = engine.free_slots()[:8]
    for slot in slots:
      engine.insert(slot, [engine.pad_id], settings)
    before = None
    for key in (gamma4, plain, plain, gamma4, gamma4):  # the first wakes the drafts: not counted
      started = time.perf_counter()
      engine.step(program=key)
      if before is not None:
        times[(names[before], names[key])].append(time.perf_counter() - started)
      before = key
    for slot in slots:
      engine.free(slot)
  rows = [{"before": b, "timed": t, "median_ms": float(np.median(v)) * 1e3, "mean_ms": float(np.mean(v)) * 1e3,
           "n": len(v)} for (b, t), v in sorted(times.items())]
  table = [f"ende pair, 8 rows, {REPEATS.value} sequences (gamma 4, plain, plain, gamma 4, gamma 4)", ""]
  table += markdown_table(["step before", "step timed", "median ms", "mean ms", "n"],
                          [[r["before"], r["timed"], f"{r['median_ms']:.2f}", f"{r['mean_ms']:.2f}", r["n"]]
                           for r in rows])
  print("\n".join(table))
  if OUTPUT.value:
    atomic_write(OUTPUT.value + ".md", "\n".join(table) + "\n")
    atomic_write_json(OUTPUT.value + ".json", {"repeats": REPEATS.value, "jax": jax.__version__, "rows": rows},
                      indent=1)


if __name__ == "__main__":
  app.run(main)
