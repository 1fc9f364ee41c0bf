"""A plain engine's step time by the length of its caches, in ONE process (issue 39: the verification budget's
caches hold a gamma-4 block's 4 positions more than a plain engine's; what do they cost?).

    .venv/bin/python docs/bench/serving/cache_length.py --rows=16 --max_new_tokens=64,68
    .venv/bin/python docs/bench/serving/cache_length.py --rows=8,16,32 --max_new_tokens=64,68,63,71,79

One plain SlotEngine of the embedded target per --max_new_tokens value (caches of that + 1 positions), every one
decoding --rows greedy requests of 56 new tokens (EOS ignored) to their end, the engines' order alternating per
block; the median step per engine and row count, and its ratio to the first engine's. The number of engines alive
in the process matters on this machine (docs/serving.md): compare runs of the same engines.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app, flags

import jaxspec
from jaxspec.serving import RequestSettings, SlotEngine

ROWS = flags.DEFINE_list("rows", ["16"], "rows decoded per step")
MAX_NEW = flags.DEFINE_list("max_new_tokens", ["64", "68"], "one engine per value (caches of value + 1 positions)")
SLOTS = flags.DEFINE_integer("slots", None, "the engines' slots (None: the most --rows; a step of fewer rows gathers "
                             "them from the slots and writes them back)")
BLOCKS = flags.DEFINE_integer("blocks", 8, "blocks (each engine's rows inserted and decoded to their end)")


def _decode(engine: SlotEngine, rows: int, prompts, steps: list | None) -> None:
  settings = RequestSettings(56, jaxspec.Sampling(0.0), ignore_eos=True)
  for i in range(rows):
    engine.insert(engine.free_slots()[0], prompts[i % len(prompts)], settings)
  while engine.active_slots():
    started = time.perf_counter()
    engine.step(program=(0, "greedy", rows))
    if steps is not None:
      steps.append(time.perf_counter() - started)


def main(_):
  rows, news = [int(r) for r in ROWS.value], [int(n) for n in MAX_NEW.value]
  target = jaxspec.load("ende-target")
  with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
    prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
  engines = {n: SlotEngine(target, None, slots=SLOTS.value or max(rows), max_input_length=64, max_new_tokens=n,
                           modes=("greedy",), budget=False) for n in news}
  for engine in engines.values():  # compile
    for r in rows:
      _decode(engine, r, prompts, None)
  steps = {(n, r): [] for n in news for r in rows}
  for b in range(BLOCKS.value):
    for r in rows:
      for n in (news if b % 2 == 0 else news[::-1]):
        _decode(engines[n], r, prompts, steps[n, r])
  for r in rows:
    base = statistics.median(steps[news[0], r])
    print(f"{r} rows: " + "  ".join(f"cache {n + 1}: {statistics.median(steps[n, r]) * 1e3:.1f} ms "
                                    f"({statistics.median(steps[n, r]) / base:.3f})" for n in news), flush=True)


if __name__ == "__main__":
  app.run(main)
