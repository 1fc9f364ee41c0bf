"""What the budget costs where it decodes plain (issue 39): at concurrency C in one process, plain, a second plain
engine and the budget engine held on plain (Budget(margin=9.9, probe=0): no drafting tier ever scores), 4 rounds
of 96 requests, each arm 16 steps in turn; per arm plan_step(), step() and insert() timed apart.
    .venv/bin/python docs/bench/serving/plain_overhead.py 64 8 8,64 [ARMS]    # S C B, arms (plain,bplain,plain2)
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
kinds = {"plain": (None, False), "plain2": (None, False), "bplain": (spec, Budget(margin=9.9, probe=0.0)),
         "bplain_ahead0": (spec, Budget(margin=9.9, probe=0.0, ahead=0))}
engines = {a: mk(*kinds[a]) for a in (sys.argv[4].split(",") if len(sys.argv) > 4 else ["plain", "bplain", "plain2"])}
for e in engines.values(): e.warmup()
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
        key, limits = e.plan_step()
        t1 = time.perf_counter()
        out = e.step(program=key, limits=limits)
        t2 = time.perf_counter()
        stat[a]["plan_s"] += t1 - t; stat[a]["step_s"] += t2 - t1; stat[a]["steps"] += 1
        stat[a]["draft_steps"] += int(not e.table.entries[key[0]].plain)
        stat[a]["step_tok"] += sum(len(x) for x in out.tokens)
for a, c in stat.items():
  tot = c["ins_s"] + c["step_s"] + c["plan_s"]; tok = c["ins_tok"] + c["step_tok"]
  print(a, f"tok/s {tok/tot:.1f}  plan ms {1e3*c['plan_s']/c['steps']:.3f}  step ms {1e3*c['step_s']/c['steps']:.2f}  "
           f"steps {c['steps']} (drafting {c['draft_steps']})  tok/step {c['step_tok']/c['steps']:.2f}  "
           f"ins ms {1e3*c['ins_s']/96/4:.2f}  ins share {c['ins_s']/tot:.3f}")
