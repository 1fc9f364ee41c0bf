"""The budget's plan at 1, 4 and 8 rows: `_choose` and `plan_step` timed 2000 times each on rows after one
plain step, against warm-up's plain step there.
    .venv/bin/python docs/bench/serving/plan_cost_rows.py
"""
import time, json, numpy as np, jaxspec
from jaxspec.serving import Budget, SlotEngine, RequestSettings
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
for R in (1, 4, 8):
  e = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), budget=Budget(probe=0.0), slots=8, max_input_length=64,
                 max_new_tokens=64, modes=("greedy",), row_buckets=[R])
  e.warmup()
  s = RequestSettings(64, jaxspec.Sampling(0.0))
  for i in range(R):
    e.insert(e.free_slots()[0], prompts[i], s)
  e.step(program=(0, "greedy", R))
  slots = np.flatnonzero(e._active)
  def once():
    return e._choose(slots, R, e._left[slots], e._behind[slots], 0, True)
  for _ in range(50): once()
  t = time.perf_counter(); n = 2000
  for _ in range(n): ch = once()
  dt = (time.perf_counter() - t) / n
  t = time.perf_counter()
  for _ in range(n): e._planned = None; e._ahead = None; e.plan_step()
  dp = (time.perf_counter() - t) / n
  print(f"rows {R}: _choose {dt*1e3:.3f} ms, plan_step {dp*1e3:.3f} ms; "
        f"plain step {e.costs.get(R, 0)*1e3:.2f} ms; chose k={ch.k}")
