"""Each budget tier served alone at one concurrency against the budget's model of it (issue 39): where the choice's
error comes from, its expected tokens E or its cost curves c(R, k).

    .venv/bin/python docs/bench/serving/served_vs_model.py --concurrency=8 --row_buckets=8,64 \
        --output=docs/bench/serving/served_vs_model_c8

One engine under the default budget (the embedded pair, gamma 4, 64 slots) warms up, then serves --rounds rounds
of --requests greedy requests (the served workload's prompts, 64 new tokens, --concurrency in flight), each round
running every tier in turn (the order reversed every other round) at every step of that tier's pass: the tier's
program with each row's limit from its estimates, as the budget would give them (`tier_limits`). Forced steps
leave the curves as warm-up measured them. Per tier: tokens per second of step time served; the model's (the sum
over its steps of E, as `choose` counts it with the rows' tokens left and the end rate, over the sum of c(R, k)
times the share of iterations expected to run; no wake or catch-up); the tokens served over E; the seconds over
the model's. Then warm-up's curves are measured again, so the report holds two warm-ups around the serving.
Writes OUTPUT.md and OUTPUT.json. Nothing else should run meanwhile.
"""

from __future__ import annotations

import collections
import json
import time

import jax
import numpy as np
from absl import app, flags

import jaxspec
from jaxspec.serving import Budget, RequestSettings, SlotEngine
from jaxspec.serving import budget as budget_rule
from jaxspec.tools.outputs import atomic_write, atomic_write_json, markdown_table

CONCURRENCY = flags.DEFINE_integer("concurrency", 8, "requests in flight")
ROW_BUCKETS = flags.DEFINE_list("row_buckets", ["8", "64"], "the engine's row buckets")
REQUESTS = flags.DEFINE_integer("requests", 96, "requests per tier and round")
ROUNDS = flags.DEFINE_integer("rounds", 4, "rounds over the tiers (their order reversed every other round)")
OUTPUT = flags.DEFINE_string("output", None, "OUTPUT.md and OUTPUT.json (None: print only)")


def _serve_tier(engine, tier: int, prompts, start: int, totals: collections.Counter) -> None:
  """--requests requests through `engine`, every step at table entry `tier` with the budget's per-row limits."""
  entry, settings, sent = engine.table.entries[tier], RequestSettings(64, jaxspec.Sampling(0.0)), 0
  while sent < REQUESTS.value or engine.active_slots():
    while sent < REQUESTS.value and len(engine.active_slots()) < CONCURRENCY.value:
      engine.insert(engine.free_slots()[0], prompts[(start + sent) % len(prompts)], settings)
      sent += 1
    slots = np.asarray(engine.active_slots())
    rows = next(b for b in engine.row_buckets if b >= len(slots))
    alpha = engine.estimates(slots)
    limits = budget_rule.tier_limits(alpha, entry.gamma, engine.budget.theta)
    hazard = np.full((len(slots),), engine.ends.rate)
    rate = budget_rule.per_row_rate(budget_rule.survival(alpha), limits)
    left = engine._left[slots].astype(np.float64)  # pylint: disable=protected-access  (tokens each may still give)
    # pylint: disable-next=protected-access
    expected, share = budget_rule._per_row(rate, left, engine.iterations_per_step, hazard)
    forced = np.zeros((engine.slots,), np.int32)
    forced[slots] = limits
    started = time.perf_counter()
    out = engine.step(program=(tier, "greedy", rows), limits=forced)
    totals["seconds"] += time.perf_counter() - started
    totals["tokens"] += sum(len(t) for t in out.tokens)
    totals["expected"] += float(expected.sum())
    totals["model_seconds"] += engine.costs.get(rows, entry.gamma) * float(share)
    totals["steps"] += 1


def main(_):
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
    prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64, max_new_tokens=64,
                      modes=("greedy",), budget=Budget(), row_buckets=[int(b) for b in ROW_BUCKETS.value])
  engine.warmup()
  before = engine.costs.lines()
  print("warm-up:\n  " + "\n  ".join(before), flush=True)
  tiers = list(range(len(engine.table.entries)))
  totals = {tier: collections.Counter() for tier in tiers}
  for r in range(ROUNDS.value):
    for tier in (tiers if r % 2 == 0 else tiers[::-1]):
      _serve_tier(engine, tier, prompts, r * REQUESTS.value, totals[tier])
  engine.costs.seconds.clear()
  engine._measure_costs()  # pylint: disable=protected-access  (warm-up's curves again, after the serving)
  after = engine.costs.lines()
  rows = []
  for tier in tiers:
    t = totals[tier]
    rows.append({"gamma": engine.table.entries[tier].gamma, "steps": t["steps"],
                 "served_tokens_per_s": t["tokens"] / t["seconds"], "model_tokens_per_s": t["expected"] /
                 t["model_seconds"], "tokens_over_expected": t["tokens"] / t["expected"],
                 "seconds_over_model": t["seconds"] / t["model_seconds"]})
  table = [f"ende pair, budget tiers served alone at concurrency {CONCURRENCY.value} (row buckets "
           f"{','.join(ROW_BUCKETS.value)}), {ROUNDS.value} rounds of {REQUESTS.value} requests a tier", ""]
  table += markdown_table(["draft length", "steps", "served tok/s (step time)", "model tok/s", "tokens / E",
                           "seconds / model"],
                          [[r["gamma"], r["steps"], f"{r['served_tokens_per_s']:.1f}", f"{r['model_tokens_per_s']:.1f}",
                            f"{r['tokens_over_expected']:.3f}", f"{r['seconds_over_model']:.3f}"] for r in rows])
  table += ["", "warm-up before serving:", *[f"- {line}" for line in before], "", "warm-up after serving:",
            *[f"- {line}" for line in after]]
  print("\n".join(table))
  if OUTPUT.value:
    atomic_write(OUTPUT.value + ".md", "\n".join(table) + "\n")
    atomic_write_json(OUTPUT.value + ".json", {"concurrency": CONCURRENCY.value, "row_buckets": ROW_BUCKETS.value,
                                               "requests": REQUESTS.value, "rounds": ROUNDS.value,
                                               "jax": jax.__version__, "warmup_before": before,
                                               "warmup_after": after, "rows": rows}, indent=1)


if __name__ == "__main__":
  app.run(main)
