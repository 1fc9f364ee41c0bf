"""How far the verification budget's warm-up curves spread within one process (issue 39): the embedded pair's budget
engine (gamma 4, 64 slots, row buckets ROWS and 64) warms up, then `_measure_costs` runs REPEATS more times; each
prints plain's c(R, 0) and every drafting tier's ratio to it per row bucket. Nothing else should run meanwhile.

    .venv/bin/python docs/bench/serving/warmup_spread.py 1,4,8 6 > docs/bench/serving/warmup_spread.log
"""

import sys
import time

import jaxspec
from jaxspec.serving import Budget, SlotEngine


def main(rows: str, repeats: str) -> None:
  buckets = [int(x) for x in rows.split(",")]
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), slots=64, max_input_length=64, max_new_tokens=64,
                      modes=("greedy",), budget=Budget(), row_buckets=buckets)
  engine.warmup()
  for rep in range(int(repeats)):
    started = time.perf_counter()
    engine._measure_costs()  # pylint: disable=protected-access
    s = engine.costs.seconds
    cells = " | ".join(f"R{r}: k0 {s[(r, 0)] * 1e3:.1f} ms "
                       + " ".join(f"{k}:{s[(r, k)] / s[(r, 0)]:.2f}" for k in (1, 2, 4)) for r in buckets)
    print(f"rep {rep} ({time.perf_counter() - started:.1f}s): {cells}", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:3])
