r"""What the variable-length loop costs over the constant one, and resting over plain decoding (timing + HLO).

    nice -n 5 .venv/bin/python docs/bench/adaptive/loop_cost.py > docs/bench/adaptive/loop_cost.txt

The embedded pair, the first 16 natural dev sentences, batch 1 and 4. Per setting, 5 interleaved rounds after a
warm-up pass, median ms per generated token of:
  plain  plain decoding;
  const  constant gamma;
  adapt  schedule="adaptive" with draft_cost=0 and no fallback: it drafts gamma tokens every iteration, exactly
         the constant loop's work, so adapt / const is the variable-length machinery's own cost;
  rest   schedule="adaptive" with prior_alpha=0, fallback_alpha=1 and no probe in reach: every iteration rests,
         so rest / plain is what a resting iteration costs against plain decoding (the draft's encoder included).
Then, for each loop, the number of `copy` instructions of the target KV cache's per-layer shape in the optimized
HLO (XLA copies buffers it cannot update in place, e.g. through a `lax.cond`).
"""

import re
import time

import jax
import numpy as np

import jaxspec
from jaxspec.data.ende import read_pairs, split_path

target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
texts = [p.en for p in read_pairs(split_path("dev")) if p.is_natural][:16]


def timed(batch: int, temperature: float, gamma: int) -> dict:
  batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
  fns = {"plain": None, "const": jaxspec.Speculation(draft, gamma=gamma),
         "adapt": jaxspec.Speculation(draft, gamma=gamma, schedule="adaptive", draft_cost=0.0),
         "rest": jaxspec.Speculation(draft, gamma=gamma, schedule="adaptive", fallback_alpha=1.0, prior_alpha=0.0,
                                     probe_interval=1000)}
  run = lambda b, s: jaxspec.generate(target, b, s, jaxspec.Sampling(temperature=temperature), max_new_tokens=64)
  tokens = {n: sum(int(run(b, kw).lengths.sum()) for b in batches) for n, kw in fns.items()}  # warm-up
  seconds = {n: [] for n in fns}
  for _ in range(5):
    for name, kw in fns.items():
      start = time.perf_counter()
      for b in batches:
        run(b, kw)
      seconds[name].append(time.perf_counter() - start)
  return {n: 1e3 * float(np.median(seconds[n])) / tokens[n] for n in fns}


def cache_copies(schedule: str | None, gamma: int = 2) -> int:
  """Copies of a target-cache leaf in the optimized HLO of the loop (schedule None: plain decoding)."""
  spec = None if schedule is None else jaxspec.Speculation(draft, gamma=gamma, schedule=schedule)
  hlo = jaxspec.lower(target, texts[:1], spec, max_new_tokens=64).loop_hlo()
  cache_len = 64 + (0 if spec is None else gamma) + 1
  leaf = next(x for x in jax.tree.leaves(jax.eval_shape(lambda: target.decoder().prefill(
      target.params, np.zeros((1, 16), np.int32), np.ones((1,), np.int32), cache_len).cache))
              if x.ndim == 4 and x.shape[2] == cache_len)
  shape = "f32[" + ",".join(map(str, leaf.shape)) + "]"
  return len(re.findall(re.escape(shape) + r"\{[0-9,]+\} copy\(", hlo))


print("setting | plain | const | adapt | rest | adapt / const | rest / plain (ms per token)")
for batch, temperature, gamma in ((1, 0.0, 2), (1, 1.0, 1), (4, 0.0, 3), (4, 1.0, 2)):
  m = timed(batch, temperature, gamma)
  print(f"batch {batch}, T {temperature:g}, gamma {gamma} | {m['plain']:.3f} | {m['const']:.3f} | {m['adapt']:.3f} | "
        f"{m['rest']:.3f} | {m['adapt'] / m['const']:.3f} | {m['rest'] / m['plain']:.3f}")
for schedule in (None, "constant", "adaptive"):
  print(f"{schedule or 'plain'} loop: {cache_copies(schedule)} copy instructions of a target-cache leaf in the HLO")
