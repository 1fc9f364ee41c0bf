"""The host's own work in a slot engine's step, outside its device work (issue 39, thirty-first session): per arm
(the budget, a fixed gamma 4, plain decoding) one engine serves ROUNDS rounds of REQUESTS greedy requests of the
served workload, C in flight, and each step() call is split into its device part (dispatch to the packed copy's
arrival: the time the budget's curves hold) and the rest (the plan and the wake's dispatch before it, the
bookkeeping of tokens and verdicts after it), with the harness's gap between two steps beside them.

    git apply docs/bench/serving/step_host_work.diff      # engine.step keeps its two parts (self._timed, self._pre)
    .venv/bin/python docs/bench/serving/step_host_work.py 1 8 48 2    # C SLOTS REQUESTS ROUNDS
    git checkout jaxspec/serving/engine.py

The arms run one after another (not interleaved): their tokens per second are this machine's spell of each, not a
comparison; the host work per step is what the script is for. Nothing else should run meanwhile.
"""
import json
import statistics
import sys
import time

import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine

c, slots, requests, rounds = (int(v) for v in sys.argv[1:5])
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
  prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
spec = jaxspec.Speculation(draft, gamma=4)
settings = RequestSettings(64, jaxspec.Sampling(0.0))
for arm, (speculation, budget) in {"budget": (spec, Budget()), "fixed": (spec, False), "plain": (None, False)}.items():
  engine = SlotEngine(target, speculation, slots=slots, max_input_length=64, max_new_tokens=64, modes=("greedy",),
                      budget=budget)
  engine.warmup()
  gaps, steps, host, before = [], [], [], []
  made, started = 0, time.perf_counter()
  for _ in range(rounds):
    sent, last_end = 0, None
    while sent < requests or engine.active_slots():
      inserting = 0.0
      while sent < requests and len(engine.active_slots()) < c:
        t = time.perf_counter()
        made += len(engine.insert(engine.free_slots()[0], prompts[sent % len(prompts)], settings).tokens)
        inserting += time.perf_counter() - t
        sent += 1
      t = time.perf_counter()
      if last_end is not None:
        gaps.append(t - last_end - inserting)
      out = engine.step()
      end = time.perf_counter()
      steps.append(end - t)
      host.append(end - t - engine._timed)  # pylint: disable=protected-access  (step_host_work.diff's)
      before.append(engine._pre)  # pylint: disable=protected-access
      made += sum(len(tokens) for tokens in out.tokens)
      last_end = end if engine.active_slots() else None
  ms = lambda values: f"{1e3 * statistics.median(values):.2f} ms (mean {1e3 * statistics.fmean(values):.2f})"
  print(f"{arm}: {made / (time.perf_counter() - started):.1f} tok/s, {len(steps)} steps, step() {ms(steps)}, "
        f"host work in it {ms(host)}, of which before the device's {ms(before)}, harness gap {ms(gaps)}",
        flush=True)
