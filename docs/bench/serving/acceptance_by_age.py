"""How a request's acceptance moves with its age (issue 39, twenty-eighth session): the embedded pair's fixed gamma 4
at concurrency 16 (32 slots, 192 requests, greedy, 64 new tokens), each row's drafted and accepted tokens per step
counted by the request's age in steps (0: its first step after the insert). A count, not a timing: the machine's
speed does not enter it.
    .venv/bin/python docs/bench/serving/acceptance_by_age.py
"""
import collections, json
import numpy as np
import jaxspec
from jaxspec.serving import RequestSettings, SlotEngine

target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
  prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=32, max_input_length=64, max_new_tokens=64,
                    modes=("greedy",), row_buckets=[16, 32])
settings, sent, age = RequestSettings(64, jaxspec.Sampling(0.0)), 0, np.zeros((32,), int)
by_age, drafted, accepted, iterations = collections.defaultdict(lambda: [0, 0]), 0, 0, 0
while sent < 192 or engine.active_slots():
  while sent < 192 and len(engine.active_slots()) < 16:
    slot = engine.free_slots()[0]
    engine.insert(slot, prompts[sent % len(prompts)], settings)
    sent, age[slot] = sent + 1, 0
  out = engine.step()
  for s in np.flatnonzero(out.drafted):
    by_age[age[s]][0] += int(out.accepted[s])
    by_age[age[s]][1] += int(out.drafted[s])
  age += 1
  drafted, accepted = drafted + out.drafted.sum(), accepted + out.accepted.sum()
  iterations += out.iterations.sum()
print(f"tau {(accepted + iterations) / iterations:.3f}, accepted per drafted token {accepted / drafted:.3f}")
for a in sorted(by_age):
  taken, given = by_age[a]
  print(f"step {a} of its request: accepted per drafted token {taken / given:.3f} ({given} drafted)")
