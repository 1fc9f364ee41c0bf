"""The verification budget's fresh plans for requests served one at a time (issue 39, twenty-third session): each
choice's estimates, inputs and scores, and each step's tier, limits and tokens.
    .venv/bin/python docs/bench/serving/budget_c1_trace.py [REQUESTS]   # default 12
"""
import json, sys, jaxspec, numpy as np
from jaxspec.serving import SlotEngine, RequestSettings
from jaxspec.serving import engine as E
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
e = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64, max_new_tokens=64,
               modes=("greedy",), row_buckets=[2, 64])
e.warmup()
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
  e.insert(e.free_slots()[0], prompts[i], s)
  print("request", i)
  while e.active_slots():
    o = e.step()
    limits = None if o.limits is None else o.limits[o.limits > 0].tolist()
    print(f" step k={o.entry.gamma} limits={limits} tok={sum(map(len, o.tokens))}")
