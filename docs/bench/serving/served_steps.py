"""Served steps at concurrency C in one process: a fixed gamma 4, the budget engine forced to its gamma-4 tier, and
plain (S slots, row buckets B; 4 rounds of 96 requests, each arm 16 steps in turn): per arm step() and insert()
timed apart, tokens per step and the inserts' share (issue 39: what a served drafting step costs in plain steps).
    .venv/bin/python docs/bench/serving/served_steps.py 64 4 1,4     # S C B
"""
import time, json, sys, collections, numpy as np, jaxspec
from jaxspec.serving import Budget, SlotEngine, RequestSettings
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
S, C = int(sys.argv[1]), int(sys.argv[2])
buckets = [int(b) for b in sys.argv[3].split(",")]
spec = jaxspec.Speculation(draft, gamma=4)
def mk(sp, b):
  return SlotEngine(target, sp, slots=S, max_input_length=64, max_new_tokens=64, modes=("greedy",), budget=b,
                    row_buckets=buckets)
engines = {"fixed": mk(spec, False), "g4budget": mk(spec, Budget(probe=0.0)), "plain": mk(None, False)}
for e in engines.values(): e.warmup()
eb = engines["g4budget"]; print({k: round(v*1e3, 2) for k, v in eb.costs.seconds.items()})
g4 = [en.gamma for en in eb.table.entries].index(4)
s = RequestSettings(64, jaxspec.Sampling(0.0))
stat = {a: collections.Counter() for a in engines}
for rnd in range(4):
  order = list(engines) if rnd % 2 == 0 else list(engines)[::-1]
  st = {a: dict(sent=0) for a in engines}
  def done(a): return st[a]["sent"] >= 96 and not engines[a].active_slots()
  while not all(done(a) for a in engines):
    for a in order:
      e = engines[a]
      for _ in range(16):
        if done(a): break
        while st[a]["sent"] < 96 and len(e.active_slots()) < C:
          prompt = prompts[(rnd * 96 + st[a]["sent"]) % len(prompts)]
          t = time.perf_counter(); out = e.insert(e.free_slots()[0], prompt, s)
          stat[a]["ins_s"] += time.perf_counter() - t; stat[a]["ins_tok"] += len(out.tokens); st[a]["sent"] += 1
        t = time.perf_counter()
        out = e.step(program=(g4, "greedy", e._bucket(len(e.active_slots())))) if a == "g4budget" else e.step()
        stat[a]["step_s"] += time.perf_counter() - t; stat[a]["steps"] += 1
        stat[a]["step_tok"] += sum(len(x) for x in out.tokens)
for a, c in stat.items():
  tot = c["ins_s"] + c["step_s"]; tok = c["ins_tok"] + c["step_tok"]
  print(a, f"tok/s {tok/tot:.1f}  step ms {1e3*c['step_s']/c['steps']:.2f}  steps {c['steps']}  "
           f"tok/step {c['step_tok']/c['steps']:.2f}  ins ms {1e3*c['ins_s']/96/4:.2f}  ins share {c['ins_s']/tot:.3f}")
