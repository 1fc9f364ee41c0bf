"""Every drafting step the budget arm takes, with its rows: arms_in_process.py's budget and plain arms at one
level, SlotEngine.step wrapped to print, for each step of a drafting tier (warm-up's timed steps included): the
active rows, the row bucket, the tier's gamma, the rows drafting, the queue, the prior a new request starts at
then (engine.acceptance.alpha, per draft position), and the step's drafted and accepted tokens over its rows. Arguments after the script's name replace the defaults below.

    python docs/bench/serving/drafting_steps_trace.py [--concurrency=16 --slots=32 ...] > trace.log
"""

import os
import runpy
import sys

import numpy as np

from jaxspec.serving import engine as engine_module

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = ["--concurrency=16", "--slots=32", "--requests=96", "--rounds=2", "--slice=16", "--arms=budget,plain"]
_step = engine_module.SlotEngine.step


def _traced_step(self, **kwargs):
  active = int(self._active.sum())  # pylint: disable=protected-access
  prior = np.round(self.acceptance.alpha, 3).tolist()
  out = _step(self, **kwargs)
  if self.budget is not None and out.entry is not None and out.entry.gamma > 0:
    limits, drafted, accepted = out.limits, int(out.drafted.sum()), int(out.accepted.sum())
    print(f"DRAFT active={active} rows={out.rows} gamma={out.entry.gamma} limits_sum={int(limits.sum())} "
          f"drafting_rows={int((limits > 0).sum())} queued={self.queued} prior={prior} drafted={drafted} "
          f"accepted={accepted} iterations={int(out.iterations.sum())} "
          f"accepted_share={accepted / max(drafted, 1):.3f}", flush=True)
  return out


if __name__ == "__main__":
  engine_module.SlotEngine.step = _traced_step
  sys.argv = [os.path.join(HERE, "arms_in_process.py")] + (sys.argv[1:] or DEFAULTS)
  sys.path.insert(0, HERE)
  runpy.run_path(sys.argv[0], run_name="__main__")
