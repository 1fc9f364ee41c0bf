"""Each request's verdicts and the served requests' acceptance (AcceptancePrior), one request at a time on the
embedded pair: under the verification budget, then with every step forced to the widest tier (issue 39).

    .venv/bin/python docs/bench/serving/request_verdicts.py --requests=40

Per request under the budget: its steps' draft lengths (0: plain), its drafted and accepted tokens, the verdicts
its estimates hold per draft position (`estimates.observed`: count and sum) and the pool after it. Then the same
requests with every step at gamma 4: the pool, the tokens per iteration and the requests' lengths. A request the
budget decodes plain adds no verdicts, so the pool reads the requests it drafted alone (docs/serving.md, the
seventeenth session). What it prints depends on the warm-up's curves: a diagnosis, not a benchmark.
"""

from __future__ import annotations

import json

import numpy as np
from absl import app, flags

import jaxspec
from jaxspec.decoding.device.estimates import observed
from jaxspec.serving import Budget, RequestSettings, SlotEngine
from jaxspec.serving.budget import AcceptancePrior

REQUESTS = flags.DEFINE_integer("requests", 40, "requests, one at a time (the served workload's prompts, in order)")


def main(_):
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  with open("docs/bench/serving_ende.jsonl", encoding="utf-8") as f:
    prompts = [target.tokenizer.encode(json.loads(line)["prompt"])[:64] for line in f]
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=1, max_input_length=64, max_new_tokens=64,
                      modes=("greedy",), budget=Budget(), row_buckets=[1])
  engine.warmup()
  print("\n".join(engine.costs.lines()), flush=True)
  settings = RequestSettings(64, jaxspec.Sampling(0.0))
  widest = next(k for k in engine.programs if engine.table.entries[k[0]].gamma == 4)

  def serve(i: int, forced: bool) -> tuple[list[int], int, int, int, int]:
    """Request i alone: (its steps' draft lengths, tokens, iterations, drafted, accepted)."""
    tokens = len(engine.insert(0, prompts[i % len(prompts)], settings).tokens)
    tiers, iterations, drafted, accepted = [], 0, 0, 0
    while engine.active_slots():
      out = (engine.step(program=widest, limits=np.full((1,), 4, np.int32)) if forced else engine.step())
      tiers.append(out.entry.gamma)
      tokens += len(out.tokens[0])
      iterations, drafted = iterations + int(out.iterations[0]), drafted + int(out.drafted[0])
      accepted += int(out.accepted[0])
    return tiers, tokens, iterations, drafted, accepted

  for i in range(REQUESTS.value):
    tiers, _, _, drafted, accepted = serve(i, forced=False)
    # its estimates and prior as it ended (the host's copies: kept until the slot's next insert)
    beta_sum, count = engine._estimates[:, 0].astype(np.float64)  # pylint: disable=protected-access
    seen_sum, seen = observed(beta_sum, count, engine._priors[0].astype(np.float64))  # pylint: disable=protected-access
    print(f"{i:3d} {''.join(map(str, tiers)):<20} accepted {accepted}/{drafted}  verdicts {np.round(seen, 2)} "
          f"sum {np.round(seen_sum, 2)}  pool {np.round(engine.acceptance.alpha, 2)}", flush=True)
  engine.acceptance = AcceptancePrior.start(engine.estimates().shape[1])
  tokens = iterations = 0
  lengths = []
  for i in range(REQUESTS.value):
    _, made, ran, _, _ = serve(i, forced=True)
    tokens, iterations = tokens + made - 1, iterations + ran  # the insert's token needs no iteration
    lengths.append(made)
  print(f"every step at gamma 4: pool {np.round(engine.acceptance.alpha, 3)}, {tokens / iterations:.2f} tokens an "
        f"iteration; lengths P10/P25/P50/P75/P90 {np.percentile(lengths, [10, 25, 50, 75, 90]).tolist()}")


if __name__ == "__main__":
  app.run(main)
