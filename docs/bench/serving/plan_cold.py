"""The budget's plan alone and after other work (issue 39): one plan_step() over 4 rows of the embedded pair, 300
times each right after nothing, a 20 ms sleep, a jitted matmul chain, or both (medians). On this project's 2-core
VMs the host's work right after the device's (or the machine's idle) runs 2-3x slower than alone: the caches.
    .venv/bin/python docs/bench/serving/plan_cold.py
"""
import time, json, numpy as np, jax, jaxspec
from jaxspec.serving import Budget, SlotEngine, RequestSettings
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
e = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64, max_new_tokens=64,
               modes=("greedy",), budget=Budget(margin=9.9, probe=0.0, ahead=0, hold=0), row_buckets=[4, 64])
e.warmup()
for i in range(4):
  e.insert(e.free_slots()[0], prompts[i], RequestSettings(64, jaxspec.Sampling(0.0)))
x = jax.numpy.ones((256, 256))
f = jax.jit(lambda a: (a @ a @ a @ a).sum())
f(x).block_until_ready()
for label, before in [("alone", None), ("after a 20 ms sleep", lambda: time.sleep(0.02)),
                      ("after a jitted matmul chain", lambda: f(x).block_until_ready()),
                      ("after the chain and 1 ms of sleep", lambda: (f(x).block_until_ready(), time.sleep(0.001)))]:
  times = []
  for _ in range(300):
    if before:
      before()
    t = time.perf_counter(); e.plan_step(); times.append(time.perf_counter() - t)
  print(f"{label}: plan {1e3 * np.median(times):.3f} ms (median of 300)")
