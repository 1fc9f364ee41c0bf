"""Where the budget held on plain spends its time beside a plain engine (issue 39): at concurrency C in one process,
plain, the budget engine held on plain (Budget(margin=9.9, probe=0)) and a second plain engine, 4 rounds of 96
requests, each arm 16 steps in turn. Per step: step() in all, its device program (STEP, waited for: the host's
work during it, the plan made ahead, then runs after it), plan_step(), the rest of step()'s host work; insert()
in all and its device program.
    .venv/bin/python docs/bench/serving/plain_split.py 4 4,64     # C B (64 slots)
"""
import time, json, sys, collections, jax, jaxspec
from jaxspec.serving import Budget, SlotEngine, RequestSettings
from jaxspec.serving import engine as E
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
spec = jaxspec.Speculation(draft, gamma=4)
C, B = int(sys.argv[1]), [int(b) for b in sys.argv[2].split(",")]
mk = lambda sp, b: SlotEngine(target, sp, slots=64, max_input_length=64, max_new_tokens=64, modes=("greedy",),
                              budget=b, row_buckets=B)
engines = {"plain": mk(None, False), "bplain": mk(spec, Budget(margin=9.9, probe=0.0)), "plain2": mk(None, False)}
for e in engines.values(): e.warmup()
s = RequestSettings(64, jaxspec.Sampling(0.0))
cur, stat = [None], {a: collections.Counter() for a in engines}
step_program, insert_program, plan = E.STEP, E.INSERT, SlotEngine.plan_step
def timed(program, key):
  def run(*a):
    t = time.perf_counter(); out = program(*a); jax.block_until_ready(out)
    stat[cur[0]][key] += time.perf_counter() - t
    return out
  return run
def timed_plan(self):
  t = time.perf_counter(); out = plan(self); stat[cur[0]]["plan"] += time.perf_counter() - t; return out
E.STEP, E.INSERT, SlotEngine.plan_step = timed(step_program, "dev"), timed(insert_program, "insdev"), timed_plan
for rnd in range(4):
  order = list(engines) if rnd % 2 == 0 else list(engines)[::-1]
  sent = {a: 0 for a in engines}
  def done(a): return sent[a] >= 96 and not engines[a].active_slots()
  while not all(done(a) for a in engines):
    for a in order:
      e = engines[a]; cur[0] = a
      for _ in range(16):
        if done(a): break
        while sent[a] < 96 and len(e.active_slots()) < C:
          t = time.perf_counter(); e.insert(e.free_slots()[0], prompts[(rnd * 96 + sent[a]) % len(prompts)], s)
          stat[a]["ins"] += time.perf_counter() - t; sent[a] += 1
        t = time.perf_counter(); e.step(); stat[a]["step"] += time.perf_counter() - t; stat[a]["n"] += 1
for a, c in stat.items():
  n = c["n"]; f = lambda x: f"{1e3 * x / n:.3f}"
  print(a, "ms a step: step", f(c["step"]), "device", f(c["dev"]), "plan", f(c["plan"]),
        "host rest", f(c["step"] - c["dev"] - c["plan"]), "| insert", f(c["ins"]), "device", f(c["insdev"]),
        "host", f(c["ins"] - c["insdev"]))
