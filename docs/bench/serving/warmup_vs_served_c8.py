"""Per process: warm-up's gamma-4 / plain ratio at 8 rows, against the served ratio at c=8 in the same process
(forced blocks of plain and gamma-4 steps, alternating; the first step of each block left out).
    .venv/bin/python docs/bench/serving/warmup_vs_served_c8.py 8 40    # block length, blocks
"""
import time, json, sys, collections, numpy as np, jaxspec
from jaxspec.serving import Budget, SlotEngine, RequestSettings
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
e = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), budget=Budget(probe=0.0), slots=8, max_input_length=64,
               max_new_tokens=64, modes=("greedy",), row_buckets=[8])
e.warmup()
c = e.costs.seconds
warm = c[(8, 4)] / c[(8, 0)]
s = RequestSettings(64, jaxspec.Sampling(0.0))
tiers = [en.gamma for en in e.table.entries]
dts, made = collections.defaultdict(list), collections.Counter()
sent, block = 0, int(sys.argv[1]) if len(sys.argv) > 1 else 8
for b in range(int(sys.argv[2]) if len(sys.argv) > 2 else 40):
  k = 0 if b % 2 == 0 else 4
  for i in range(block if k == 0 else max(2, block // 3)):
    while len(e.active_slots()) < 8:
      e.insert(e.free_slots()[0], prompts[sent % len(prompts)], s); sent += 1
    t = time.perf_counter(); out = e.step(program=(tiers.index(k), "greedy", 8)); dt = time.perf_counter() - t
    if i:
      dts[k].append(dt); made[k] += sum(len(x) for x in out.tokens)
m0, m4 = np.median(dts[0]), np.median(dts[4])
tps = {k: made[k] / sum(dts[k]) for k in dts}
print(json.dumps({"warm_ratio": round(warm, 3), "served_ratio": round(m4 / m0, 3), "plain_ms": round(m0 * 1e3, 2),
                  "g4_ms": round(m4 * 1e3, 2), "served_tps_g4_over_plain": round(tps[4] / tps[0], 3)}), flush=True)
