"""The verification budget against plain decoding in one process, no HTTP: 64 slots kept full from the embedded
workload (docs/bench/serving_ende.jsonl, greedy, 3 x C requests, a freed slot refilled at once), two rounds each,
tokens/s and the steps by draft length (0: plain). `PYTHONPATH=. python docs/bench/serving/budget_churn.py 64`;
output: budget_churn.log."""
import json, time, collections, sys, numpy as np, jaxspec
from jaxspec.serving import SlotEngine, RequestSettings
target = jaxspec.load("ende-target"); draft = jaxspec.load("ende-draft")
items = [json.loads(l) for l in open("docs/bench/serving_ende.jsonl")]
texts = [it.get("prompt") or it.get("text") or list(it.values())[0] for it in items]
ids = [target.tokenizer.encode(t)[:64] for t in texts]
C = int(sys.argv[1]) if len(sys.argv) > 1 else 64
N = 3 * C
def run(engine, label):
  engine.warmup()
  s = RequestSettings(64, jaxspec.Sampling(0.0))
  for rnd in range(2):
    nxt, tokens, tiers = 0, 0, collections.Counter()
    t0 = time.perf_counter()
    for slot in range(C):
      out = engine.insert(slot, ids[nxt % len(ids)], s); nxt += 1; tokens += len(out.tokens)
    while engine.active_slots() or nxt < N:
      out = engine.step()
      tiers[None if out.entry is None else out.entry.gamma] += 1
      tokens += sum(len(t) for t in out.tokens)
      for slot in engine.free_slots():
        if nxt < N and len(engine.active_slots()) < C:
          o = engine.insert(slot, ids[nxt % len(ids)], s); nxt += 1; tokens += len(o.tokens)
    dt = time.perf_counter() - t0
    print(label, "round", rnd, "tok/s", round(tokens / dt, 1), "steps by draft length", dict(tiers), flush=True)
which = sys.argv[2] if len(sys.argv) > 2 else "both"
if which in ("both", "plain"):
  run(SlotEngine(target, None, slots=64, max_input_length=64, max_new_tokens=64, modes=("greedy",)), "plain")
if which in ("both", "budget"):
  run(SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64, max_new_tokens=64, modes=("greedy",)), "budget")
