"""The verification budget's fresh plans for requests served one at a time on the fake clock (issue 39, twenty-fourth
session): the engine charged from a budget's warm-up curves (model_clock.py), the workload's requests in the order
arms_in_process.py serves them (four rounds of 48 from offsets 0, 48, 32, 16); each fresh plan's estimates and
choice, each step's tier and tokens, each request's pool at its insert.
    .venv/bin/python docs/bench/serving/budget_c1_trace_fake.py docs/bench/serving/arms_ende_s69_amd_c1_c4.log 192
"""
import json, sys
import numpy as np
sys.path.insert(0, "docs/bench/serving")
import jaxspec
from jaxspec.serving import SlotEngine, RequestSettings, Budget
from jaxspec.serving import engine as E
import model_clock
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
e = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64, max_new_tokens=64,
               modes=("greedy",), budget=Budget())
clock = model_clock.ModelClock(model_clock.read_curves(sys.argv[1]))
clock.install([e])
s = RequestSettings(64, jaxspec.Sampling(0.0))
orig = E.SlotEngine._choose
def traced(self, slots, rows, left, behind, current, after_plain):
  c = orig(self, slots, rows, left, behind, current, after_plain)
  est = [[round(float(a), 2) for a in row] for row in self.estimates(slots)]
  other = None if c.other is None else (c.other.k, round(c.other.expected, 2), round(c.other.cost * 1e3, 1))
  print(f"  choose: est {est} left {left.tolist()} cur {current} -> k={c.k} exp={c.expected:.2f} cost={c.cost * 1e3:.1f}ms other={other}")
  return c
E.SlotEngine._choose = traced
order = []
for r in range(4):
  off = r * 48 % len(prompts)
  order += (prompts[off:] + prompts[:off])[:48]
for i in range(int(sys.argv[2])):
  e.insert(e.free_slots()[0], order[i], s)
  print("request", i, "pool", np.round(e.acceptance.alpha, 2).tolist())
  while e.active_slots():
    o = e.step()
    limits = None if o.limits is None else o.limits[o.limits > 0].tolist()
    print(f" step k={o.entry.gamma} limits={limits} tok={sum(map(len, o.tokens))} acc={o.accepted[o.accepted>0].tolist()}")
