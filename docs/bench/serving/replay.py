"""The verification budget's choices replayed, without timing anything, on the embedded pair's exact draft matches.

    PYTHONPATH=. python docs/bench/serving/replay.py                       # the table below, into replay.md
    PYTHONPATH=. python docs/bench/serving/replay.py --prior_counts=2,8    # compare estimate priors

At temperature 0 whether a draft token is accepted depends on its position only: the draft's greedy token after the
target's own prefix, against the target's token there (every accepted token is the target's). So one plain decode
of each workload prompt (docs/bench/serving_ende.jsonl) and one teacher-forced pass of the draft give a match
vector m[p] per request, and any draft-length policy's tokens follow from it: an iteration at position p with draft
limit l gives the run of matches from p (at most l) plus one token.

The replay runs the slot engine's step as the engine does: C requests kept in flight (a finished one replaced after
its step, as a closed-loop client does), the row bucket of the active count, iterations_per_step iterations per
step stopping when every row ended, per-row limits chosen by `jaxspec.serving.budget.choose` from estimates updated
by `jaxspec.decoding.device.estimates.Estimates.update` (the device's rule, run here), and the rows' end rate and
tokens left as the engine gives them. A step costs its program's c(R, k) from a budget server's warmup log (times
the share of iterations run), a drafting step with a rested row the catch-up too, an insert INSERT_MS. Plain and a
fixed gamma run the same way. Output: tokens per ms of this cost model per concurrency, and the budget's ratio to
the better of plain and the fixed gamma: what a choice rule gives on this workload where timings do not vary.
It leaves out what served timings add (the HTTP work's share of the CPU, switches' streaming): docs/serving.md.
It also leaves out what the engine added since (the served requests' pooled prior, probes, held plans, the wakes
and plain's settle): `arms_in_process.py --cost_model=LOG` runs the engine itself on such curves (model_clock.py),
and supersedes this replay.
"""

from __future__ import annotations

import argparse
import json
import os
import re

import jax.numpy as jnp
import numpy as np

from jaxspec.decoding.device import estimates as est
from jaxspec.serving.budget import Budget, EndRate, choose

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "..", "serving_ende.jsonl")
MATCHES = os.path.join(HERE, "replay_matches.json")
CURVES = os.path.join(HERE, "final_budget.log")
INSERT_MS = 4.5  # one insert (the embedded pair's, measured in one process)
ITERATIONS, GAMMA, MAX_TOKENS = 4, 4, 64


def match_vectors(path: str = MATCHES) -> list[list[int]]:
  """Per workload prompt m[p] in {0, 1} over the target's greedy output (EOS included); cached in `path`."""
  if os.path.exists(path):
    return json.load(open(path))
  import jaxspec  # pylint: disable=import-outside-toplevel
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  prompts = [json.loads(line)["prompt"] for line in open(WORKLOAD)]
  out = jaxspec.generate(target, prompts, max_new_tokens=MAX_TOKENS)
  decoder, vectors = draft.decoder(), []
  for i, prompt in enumerate(prompts):
    ids = list(target.tokenizer.encode(prompt))
    y = [int(t) for t in out.tokens[i][:int(out.lengths[i])]]
    pre = decoder.prefill(draft.params, jnp.asarray([ids], jnp.int32), jnp.asarray([len(ids)], jnp.int32),
                          2 * MAX_TOKENS)
    logits = decoder.step(draft.params, pre.cache, jnp.asarray([[int(pre.first[0])] + y[:-1]], jnp.int32)).logits
    vectors.append([int(a == b) for a, b in zip(np.asarray(jnp.argmax(logits[0], -1)).tolist(), y)])
  json.dump(vectors, open(path, "w"))
  return vectors


def cost_curves(log: str) -> tuple[dict[int, dict[int, float]], dict[int, float]]:
  """({R: {k: ms}}, {R: catch-up ms}) from a budget server's warmup lines ('rows R: k=0 1.2 ms, ..., catch-up 0.4
  ms')."""
  costs, catchup = {}, {}
  for line in open(log):
    m = re.match(r"\s*rows (\d+): (.*)", line)
    if m:
      rows = int(m.group(1))
      costs[rows] = {int(k): float(v) for k, v in re.findall(r"k=(\d+) ([\d.]+) ms", m.group(2))}
      c = re.search(r"catch-up ([\d.]+) ms", m.group(2))
      catchup[rows] = float(c.group(1)) if c else 0.0
  return costs, catchup


def replay(vectors, policy, concurrency: int, costs, catchup, requests: int = 256, seed: int = 0,
           budget: Budget = Budget(), prior_count: float = est.PRIOR_COUNT) -> float:
  """Tokens per ms of the cost model. policy: "plain", "fixed" (GAMMA) or "budget"."""
  order = list(np.random.default_rng(seed).permutation(len(vectors))) * (requests // len(vectors) + 1)
  buckets, tiers = sorted(costs), budget.tiers_for(GAMMA)
  prior = (np.full((GAMMA,), prior_count * est.PRIOR_ALPHA, np.float32), np.full((GAMMA,), prior_count, np.float32))
  ends, rows, given, ms, started, current = EndRate(), [], 0, 0.0, 0, None

  def admit():
    nonlocal started, ms
    rows.append({"m": vectors[order[started]], "p": 0, "sum": prior[0].copy(), "count": prior[1].copy(),
                 "behind": False})
    started, ms = started + 1, ms + INSERT_MS

  while len(rows) < concurrency:
    admit()
  while rows:
    bucket = next(b for b in buckets if b >= len(rows))
    if policy == "plain" or policy == "fixed":
      k = 0 if policy == "plain" else GAMMA
      limits = np.full((len(rows),), k, np.int32)
    else:
      alpha = np.clip(np.stack([r["sum"] / r["count"] for r in rows]), 0, 1)
      choice = choose(alpha, tiers, [costs[bucket][t] for t in tiers], budget.theta,
                      left=np.array([MAX_TOKENS - r["p"] for r in rows]), iterations=ITERATIONS,
                      behind=np.array([r["behind"] for r in rows]), catchup=catchup[bucket],
                      hazard=np.full((len(rows),), ends.rate), current=current, stick=budget.stick)
      current, k, limits = choice.tier, choice.k, choice.limits
    caught_up = any(l > 0 and r["behind"] for r, l in zip(rows, limits))
    iterations = 0
    for _ in range(ITERATIONS):
      if all(r["p"] >= len(r["m"]) for r in rows):
        break
      iterations += 1
      drafted, accepted, beta, active = [], [], [], []
      for r, l in zip(rows, limits):
        m, p = r["m"], r["p"]
        live = p < len(m)
        n = 0
        while live and n < l and p + n < len(m) and m[p + n]:
          n += 1
        if live:
          r["p"] += min(n + 1, len(m) - p)
          given += min(n + 1, len(m) - p)
        drafted.append(int(l)); accepted.append(n); active.append(live)
        beta.append([float(m[p + j]) if p + j < len(m) else 1.0 for j in range(GAMMA)])
      if policy == "budget":
        state = est.Estimates(beta_sum=jnp.asarray(np.stack([r["sum"] for r in rows])),
                              count=jnp.asarray(np.stack([r["count"] for r in rows])),
                              prior=jnp.full((len(rows), GAMMA), est.PRIOR_ALPHA, jnp.float32))
        state = state.update(jnp.asarray(active), jnp.asarray(drafted, jnp.int32), jnp.asarray(accepted, jnp.int32),
                             jnp.asarray(beta, jnp.float32))
        for b, r in enumerate(rows):
          r["sum"], r["count"] = np.asarray(state.beta_sum[b]), np.asarray(state.count[b])
    ms += costs[bucket][k] * iterations / ITERATIONS + (catchup[bucket] if caught_up else 0.0)
    kept = []
    for r, l in zip(rows, limits):
      r["behind"] = bool(l == 0)
      if r["p"] >= len(r["m"]):
        ends.observe(r["p"], r["p"] < MAX_TOKENS)
      else:
        kept.append(r)
    rows[:] = kept
    while len(rows) < concurrency and started < requests:
      admit()
  return given / ms


def main():
  flags = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  flags.add_argument("--curves", default=CURVES, help="a budget server's log with its warmup cost lines")
  flags.add_argument("--concurrency", default="1,2,4,8,16,32,64")
  flags.add_argument("--prior_counts", default=str(est.PRIOR_COUNT), help="estimate priors to replay the budget with")
  flags.add_argument("--requests", type=int, default=256)
  flags.add_argument("--output", default=os.path.join(HERE, "replay"))
  args = flags.parse_args()
  vectors, (costs, catchup) = match_vectors(), cost_curves(args.curves)
  priors = [float(v) for v in args.prior_counts.split(",")]
  head = "| C | plain | fixed 4 | " + " | ".join(f"budget (prior {p:g}) | ÷ better" for p in priors) + " |"
  lines = [head, "|" + "---|" * (3 + 2 * len(priors))]
  results = []
  for c in (int(v) for v in args.concurrency.split(",")):
    plain, fixed = (replay(vectors, p, c, costs, catchup, args.requests) for p in ("plain", "fixed"))
    row = {"concurrency": c, "plain": plain, "fixed": fixed, "budget": {}}
    cells = [f"{plain:.3f}", f"{fixed:.3f}"]
    for p in priors:
      b = replay(vectors, "budget", c, costs, catchup, args.requests, prior_count=p)
      row["budget"][str(p)] = b
      cells += [f"{b:.3f}", f"{b / max(plain, fixed):.3f}"]
    results.append(row)
    lines.append(f"| {c} | " + " | ".join(cells) + " |")
    print(lines[-1], flush=True)
  with open(args.output + ".md", "w") as f:
    f.write(f"Tokens per ms of the cost model (curves: {os.path.relpath(args.curves, HERE)}), {args.requests} "
            f"requests a level; `docs/bench/serving/replay.py`.\n\n" + "\n".join(lines) + "\n")
  json.dump({"curves": args.curves, "requests": args.requests, "results": results},
            open(args.output + ".json", "w"), indent=1)


if __name__ == "__main__":
  main()
