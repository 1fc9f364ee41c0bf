"""Request by request at concurrency 1 (issue 39, thirty-second session): engines in one process serve the same
greedy requests of the embedded pair's workload one after another, each request by every engine in turn (the order
rotating by request), so that each request's time (insert to last step) is compared on the same prompt, a few
seconds apart. Per arm: tokens per second and its ratio to the second arm's, the steps by draft length; then, for
the requests where a budget arm ran the widest tier at every step with as many steps as the fixed arm (their
choices the fixed engine's), the time it took beyond the fixed arm's per step: what its host work and its program
cost beside the fixed engine's.

    .venv/bin/python docs/bench/serving/paired_c1.py 192 budget,fixed,plain OUT.json   # N ARMS [JSON]
    .venv/bin/python docs/bench/serving/paired_c1.py --summarize OUT.json               # the printout again

ARMS: budget, fixed (gamma 4) and plain, comma-separated; the second is the ratios' base; each engine warms up on
its own (its own cost curves). Nothing else should run meanwhile.
"""
import collections
import json
import sys
import time

import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine


def serve(n: int, arms: list[str]) -> dict:
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
    prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
  spec, settings = jaxspec.Speculation(draft, gamma=4), RequestSettings(64, jaxspec.Sampling(0.0))
  engines = {}
  for arm in arms:
    engines[arm] = SlotEngine(target, None if arm == "plain" else spec, slots=8, max_input_length=64,
                              max_new_tokens=64, modes=("greedy",), budget=Budget() if arm == "budget" else False)
    engines[arm].warmup()
  log = {arm: [] for arm in arms}  # per request: [seconds, tokens, [[draft length, tokens] per step]]
  for i in range(n):
    for arm in arms[i % len(arms):] + arms[:i % len(arms)]:
      engine = engines[arm]
      started = time.perf_counter()
      first = engine.insert(engine.free_slots()[0], prompts[i % len(prompts)], settings)
      steps = []
      while engine.active_slots():
        out = engine.step()
        steps.append([out.entry.gamma, sum(len(t) for t in out.tokens)])
      log[arm].append([time.perf_counter() - started, len(first.tokens) + sum(t for _, t in steps), steps])
  return log


def summarize(log: dict) -> None:
  arms = list(log)
  base = arms[1] if len(arms) > 1 else arms[0]
  rate = {arm: sum(r[1] for r in log[arm]) / sum(r[0] for r in log[arm]) for arm in arms}
  for arm in arms:
    steps = collections.Counter(k for r in log[arm] for k, _ in r[2])
    print(f"{arm}: {rate[arm]:.1f} tok/s, {rate[arm] / rate[base]:.3f} of {base}'s, {len(log[arm])} requests, "
          f"steps by draft length {dict(sorted(steps.items()))}")
  if "fixed" not in log:
    return
  widest = max(k for r in log["fixed"] for k, _ in r[2])
  for arm in arms:
    if arm in ("fixed", "plain"):
      continue
    same = [(a, f) for a, f in zip(log[arm], log["fixed"])
            if all(k == widest for k, _ in a[2]) and len(a[2]) == len(f[2])]
    count = sum(len(a[2]) for a, _ in same)
    extra = sum(a[0] - f[0] for a, f in same)
    print(f"{arm}: {len(same)} requests ran gamma {widest} at every step as the fixed arm did ({count} steps): "
          f"{1e3 * extra / max(count, 1):.2f} ms a step beyond the fixed arm's")


if __name__ == "__main__":
  if sys.argv[1] == "--summarize":
    with open(sys.argv[2], encoding="utf-8") as f:
      summarize(json.load(f))
  else:
    result = serve(int(sys.argv[1]), sys.argv[2].split(","))
    if len(sys.argv) > 3:
      with open(sys.argv[3], "w", encoding="utf-8") as f:
        json.dump(result, f)
    summarize(result)
