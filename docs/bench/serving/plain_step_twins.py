"""Three plain engines' forced plain steps beside the budget engine's (no probes), row bucket R
(argv[1]), c=R, 6 rounds of 64 requests rotated: the compiled step alone (dispatch + run) and the rest of step().
    .venv/bin/python docs/bench/serving/plain_step_twins.py 4
"""
import time, json, sys, numpy as np, jaxspec, jax
from jaxspec.serving import Budget, SlotEngine, RequestSettings
import jaxspec.serving.engine as EN
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
R = int(sys.argv[1])
kw = dict(slots=64, max_input_length=64, max_new_tokens=64, modes=("greedy",), row_buckets=[R])
E = {name: SlotEngine(target, None, budget=False, **kw) for name in ("plain", "plain2", "plain3")}
E["budget"] = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), budget=Budget(probe=0.0), **kw)
for e in E.values(): e.warmup()
orig = EN.STEP; acc = {}
def timed(*a):
  t = time.perf_counter(); out = orig(*a); jax.block_until_ready(out); acc["t"] = time.perf_counter() - t; return out
EN.STEP = timed
s = RequestSettings(64, jaxspec.Sampling(0.0))
dev = {n: [] for n in E}; tot = {n: [] for n in E}
for rep in range(6):
  for name, e in (list(E.items())[rep % 4:] + list(E.items())[:rep % 4]):
    sent = 0
    while sent < 64 or e.active_slots():
      while sent < 64 and len(e.active_slots()) < R:
        e.insert(e.free_slots()[0], prompts[sent % len(prompts)], s); sent += 1
      t = time.perf_counter(); e.step(program=(0, "greedy", R)); dt = time.perf_counter() - t
      if rep: dev[name].append(acc["t"]); tot[name].append(dt)
for name in E:
  d, t = np.array(dev[name]) * 1e3, np.array(tot[name]) * 1e3
  print(f"{name}: STEP median {np.median(d):.2f} ms, step() median {np.median(t):.2f} ms, "
        f"rest {np.median(t - d):.2f} ms, steps {len(d)}")
