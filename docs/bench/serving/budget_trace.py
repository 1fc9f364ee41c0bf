"""The verification budget's choices step by step, on the embedded pair, one engine, a closed loop (issue 39).

    .venv/bin/python docs/bench/serving/budget_trace.py --concurrency=1 --row_buckets=1 --requests=96

Prints warm-up's curves, then every 100 steps a line of the steps' draft lengths (0: plain) with the probes marked
([4Ps1] [4Ps2]: a probe's first and second step of gamma 4, of the other side (s) or of the running side's other
tier (t)) and the curves c(R, k) then at the level's row bucket R; at the end, per draft length, the steps, the
tokens per second of step time, and the median time of the steps that ran all their iterations (those the budget
learns from). What it prints depends on the machine's speed at the time: a diagnosis, not a benchmark.
"""

from __future__ import annotations

import collections
import json
import time

import numpy as np
from absl import app, flags

import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine

CONCURRENCY = flags.DEFINE_integer("concurrency", 1, "requests in flight")
ROW_BUCKETS = flags.DEFINE_list("row_buckets", ["1"], "the engine's row buckets (its slots: the largest)")
REQUESTS = flags.DEFINE_integer("requests", 96, "requests in all")


def main(_):
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
    prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
  buckets = [int(b) for b in ROW_BUCKETS.value]
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=max(buckets), max_input_length=64,
                      max_new_tokens=64, modes=("greedy",), budget=Budget(), row_buckets=buckets)
  engine.warmup()
  print("\n".join(engine.costs.lines()), flush=True)
  rows = min(b for b in buckets if b >= CONCURRENCY.value)
  settings = RequestSettings(64, jaxspec.Sampling(0.0))
  served = collections.defaultdict(lambda: [0, 0.0, 0])  # k -> tokens, seconds, steps
  full = collections.defaultdict(list)  # k -> the seconds of the steps that ran every iteration
  trace, sent = [], 0
  while sent < REQUESTS.value or engine.active_slots():
    while sent < REQUESTS.value and len(engine.active_slots()) < CONCURRENCY.value:
      engine.insert(engine.free_slots()[0], prompts[sent % len(prompts)], settings)
      sent += 1
    started = time.perf_counter()
    out = engine.step()
    seconds = time.perf_counter() - started
    k, run = out.entry.gamma, engine._runs.run  # pylint: disable=protected-access
    entry = served[k]
    entry[0] += sum(len(t) for t in out.tokens)
    entry[1] += seconds
    entry[2] += 1
    if out.iterations.max() >= engine.iterations_per_step:
      full[k].append(seconds)
    trace.append(f"[{k}P{run.probe[0]}{run.probe_step}]" if run.probe else str(k))
    if len(trace) % 100 == 0:
      curves = " ".join(f"{g}:{engine.costs.seconds[(rows, g)] * 1e3:.1f}" for r, g in sorted(engine.costs.seconds)
                        if r == rows)
      print(len(trace), "".join(trace[-100:]), "| ms", curves, flush=True)
  for k, (tokens, seconds, steps) in sorted(served.items()):
    median = f"{np.median(full[k]) * 1e3:.1f} ms" if full[k] else "-"
    print(f"k={k}: {steps} steps, {tokens / seconds:.1f} tok/s of step time, {tokens / steps:.2f} tokens a step, "
          f"full steps ({len(full[k])}) median {median}")


if __name__ == "__main__":
  app.run(main)
