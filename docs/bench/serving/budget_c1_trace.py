"""The verification budget's fresh plans for requests served one at a time (issue 39, twenty-third session): each
choice's estimates, inputs and scores, and each step's tier, limits and tokens.
    .venv/bin/python docs/bench/serving/budget_c1_trace.py [REQUESTS]            # default 12, warmed up, timed
    .venv/bin/python docs/bench/serving/budget_c1_trace.py REQUESTS LOG          # on the fake clock (twenty-fourth
                                                                                  # session)
With LOG (a budget's warm-up curves, model_clock.py) the engine runs no warm-up and is charged from those curves,
on the engine's default row buckets, the requests in the order arms_in_process.py serves them (rounds of 48 from
offsets 0, 48, 32, 16), and each request's line gives the pool (AcceptancePrior) at its insert.
"""
import json, sys, jaxspec, numpy as np
from jaxspec.serving import SlotEngine, RequestSettings
from jaxspec.serving import engine as E
sys.path.insert(0, "docs/bench/serving")
import model_clock
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
fake = len(sys.argv) > 2
e = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64, max_new_tokens=64,
               modes=("greedy",), row_buckets=None if fake else [2, 64])
if fake:
  model_clock.ModelClock(model_clock.read_curves(sys.argv[2])).install([e])
  order = [p for r in range(4) for p in (prompts[r * 48 % len(prompts):] + prompts[:r * 48 % len(prompts)])[:48]]
else:
  e.warmup()
  order = prompts
s = RequestSettings(64, jaxspec.Sampling(0.0))
orig = E.SlotEngine._choose
def traced(self, slots, rows, left, behind, current, after_plain):
  c = orig(self, slots, rows, left, behind, current, after_plain)
  est = [[round(float(a), 2) for a in row] for row in self.estimates(slots)]
  other = None if c.other is None else (c.other.k, round(c.other.expected, 2), round(c.other.cost * 1e3, 1))
  print(f"  choose: est {est} left {left.tolist()} behind {behind.tolist()} cur {current} after_plain {after_plain}"
        f" -> k={c.k} exp={c.expected:.2f} cost={c.cost * 1e3:.1f}ms other={other}")
  return c
E.SlotEngine._choose = traced
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 12):
  e.insert(e.free_slots()[0], order[i], s)
  print("request", i, *(["pool", np.round(e.acceptance.alpha, 2).tolist()] if fake else []))
  while e.active_slots():
    o = e.step()
    limits = None if o.limits is None else o.limits[o.limits > 0].tolist()
    print(f" step k={o.entry.gamma} limits={limits} tok={sum(map(len, o.tokens))}")
