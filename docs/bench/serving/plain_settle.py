"""A plain step's time right after drafting steps: R one-token rows (EOS ignored), two steps of tier a, then four of
tier b timed one by one (medians over 20 repeats), for a -> b in 4 -> 0, 1 -> 0, 2 -> 0, 0 -> 0 and 4 -> 4; the
budget engine's warm-up curves at R printed first (issue 39, budget.settle_steps).
    .venv/bin/python docs/bench/serving/plain_settle.py 8     # rows
The 4 -> 4 rows' third and fourth steps run out of their 64 tokens (read only its first two).
"""
import collections, sys, time
import numpy as np
import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine

target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
R = int(sys.argv[1])
e = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), budget=Budget(probe=0.0), slots=64, max_input_length=64,
               max_new_tokens=64, modes=("greedy",), row_buckets=[R])
e.warmup()
print("curves", {k: round(v * 1e3, 2) for k, v in e.costs.seconds.items() if k[0] == R})
tiers = [en.gamma for en in e.table.entries]
s = RequestSettings(64, jaxspec.Sampling(0.0), ignore_eos=True)
pairs, res = ((4, 0), (1, 0), (2, 0), (0, 0), (4, 4)), collections.defaultdict(list)
for rep in range(20):
  for a, b in pairs:
    for slot in e.active_slots():
      e.free(slot)
    for i in range(R):
      e.insert(e.free_slots()[0], [e.pad_id], s)
    for _ in range(2):
      e.step(program=(tiers.index(a), "greedy", R))
    for n in range(4):
      t = time.perf_counter()
      e.step(program=(tiers.index(b), "greedy", R))
      res[(a, b, n)].append(time.perf_counter() - t)
for a, b in pairs:
  print(f"{a}->{b}:", " ".join(f"{np.median(res[(a, b, n)]) * 1e3:.2f}" for n in range(4)))
