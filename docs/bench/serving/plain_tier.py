"""What a verification-budget engine's plain step costs against a plain engine's, step by step in ONE process
(issue 39: at concurrency 8 and more the budget decodes plain; does its plain tier cost more than plain decoding?).

    .venv/bin/python docs/bench/serving/plain_tier.py --output=docs/bench/serving/plain_tier

Four engines on the embedded pair, greedy, 64 new tokens, EOS ignored, every one of --rows rows inserted and
decoded to its end, the engines' order alternating per block:
  plain       SlotEngine(target): no drafter, caches of max_new_tokens + 1 positions;
  plain_long  the same with 4 more positions per row (the budget's caches: a gamma-4 block's slack);
  budget      SlotEngine(target, Speculation(draft, gamma=4)) under the default budget, its plain tier forced
              (limits 0): the drafter's state out of the step, the acceptance estimates kept, W = 5 I tokens back;
  lean        that budget engine's plain programs without the estimates and with W = I (what is left of the
              budget's plain step is its caches' length).
Per engine and row count: the median step and insert times over every block, the median of each block's step
times (block by block, so a slow spell of the machine shows as one), and the ratio to plain. Writes OUTPUT.md and
OUTPUT.json. Nothing else should run meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time

import jax
import numpy as np
from absl import app, flags

import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine
from jaxspec.tools.outputs import atomic_write, atomic_write_json, markdown_table

ROWS = flags.DEFINE_list("rows", ["8", "16", "32"], "rows decoded per step (each a row bucket)")
BLOCKS = flags.DEFINE_integer("blocks", 12, "blocks (each engine's rows inserted and decoded to their end)")
OUTPUT = flags.DEFINE_string("output", None, "OUTPUT.md and OUTPUT.json (None: print only)")
NEW_TOKENS = 64


def _engines(target, draft, slots: int) -> dict:
  """{name: (engine, its plain program's table entry)}."""
  def make(speculation, new_tokens=NEW_TOKENS):
    return SlotEngine(target, speculation, slots=slots, max_input_length=64, max_new_tokens=new_tokens,
                      modes=("greedy",), budget=Budget() if speculation is not None else False)
  speculation = jaxspec.Speculation(draft, gamma=4)
  engines = {"plain": make(None), "plain_long": make(None, NEW_TOKENS + 4), "budget": make(speculation),
             "lean": make(speculation)}
  programs = engines["lean"]._programs  # pylint: disable=protected-access  (the variant swaps its programs in)
  tier = next(i for i, e in enumerate(engines["lean"].table.entries) if e.plain)
  for key, program in list(programs.items()):
    if key[0] == tier:
      programs[key] = dataclasses.replace(program, estimates=False, width=program.iterations)
  return {name: (e, next(i for i, entry in enumerate(e.table.entries) if entry.plain)) for name, e in engines.items()}


def _decode(engine: SlotEngine, tier: int, rows: int, prompts, steps: list | None, inserts: list | None) -> None:
  """`rows` requests inserted, then plain steps until they end; each step's and insert's seconds appended."""
  settings = RequestSettings(NEW_TOKENS, jaxspec.Sampling(0.0), ignore_eos=True)
  for i in range(rows):
    started = time.perf_counter()
    engine.insert(engine.free_slots()[0], prompts[i % len(prompts)], settings)
    if inserts is not None:
      inserts.append(time.perf_counter() - started)
  limits = None if engine.budget is None else np.zeros((engine.slots,), np.int32)
  while engine.active_slots():
    started = time.perf_counter()
    engine.step(program=(tier, "greedy", rows), limits=limits)
    if steps is not None:
      steps.append(time.perf_counter() - started)


def main(_):
  rows = [int(r) for r in ROWS.value]
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
    prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
  engines = _engines(target, draft, max(rows))
  for engine, tier in engines.values():  # compile every program timed below
    for r in rows:
      _decode(engine, tier, r, prompts, None, None)
  steps = {(n, r): [] for n in engines for r in rows}
  blocks = {(n, r): [] for n in engines for r in rows}
  inserts = {(n, r): [] for n in engines for r in rows}
  names = list(engines)
  for b in range(BLOCKS.value):
    for r in rows:
      for name in (names if b % 2 == 0 else names[::-1]):
        block = []
        _decode(*engines[name], r, prompts, block, inserts[name, r])
        steps[name, r] += block
        blocks[name, r].append(statistics.median(block))
  results = []
  for r in rows:
    base = statistics.median(steps["plain", r])
    base_insert = statistics.median(inserts["plain", r])
    for name in names:
      step, insert = statistics.median(steps[name, r]), statistics.median(inserts[name, r])
      results.append({"engine": name, "rows": r, "step_ms": step * 1e3, "step_ratio": step / base,
                      "insert_ms": insert * 1e3, "insert_ratio": insert / base_insert,
                      "slower_blocks": sum(x > y for x, y in zip(blocks[name, r], blocks["plain", r])),
                      "block_step_ms": [x * 1e3 for x in blocks[name, r]]})
  table = [f"embedded pair, greedy, {NEW_TOKENS} new tokens, {BLOCKS.value} blocks, one process "
           f"(JAX {jax.__version__}, {jax.devices()[0].platform})", ""]
  table += markdown_table(["rows", "engine", "step ms", "/ plain", "insert ms", "/ plain", "blocks slower than plain"],
                          [[x["rows"], x["engine"], f"{x['step_ms']:.2f}", f"{x['step_ratio']:.3f}",
                            f"{x['insert_ms']:.2f}", f"{x['insert_ratio']:.3f}",
                            "-" if x["engine"] == "plain" else f"{x['slower_blocks']} of {BLOCKS.value}"]
                           for x in results])
  print("\n".join(table))
  if OUTPUT.value:
    atomic_write(OUTPUT.value + ".md", "\n".join(table) + "\n")
    atomic_write_json(OUTPUT.value + ".json", {"blocks": BLOCKS.value, "new_tokens": NEW_TOKENS,
                                               "jax": jax.__version__, "results": results}, indent=1)


if __name__ == "__main__":
  app.run(main)
