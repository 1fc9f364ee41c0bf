"""The paper's cost ratios on this machine for its model shapes: c and r with random weights, no checkpoints.

Random weights have the real shapes (`jaxspec.models.t5.shapes.T5_SHAPES`), so they cost what the real checkpoints cost;
only alpha needs trained models. For each draft shape and batch size: the target's decoder step on 1 and on
gamma + 1 tokens (r), each draft's 1-token step (c), Theorem 3.8's expected speedup at the paper's alpha for that
pair (Table 2, `jaxspec.bench.presets`) next to the paper's speedup; and, at batch 1, the real speculative loop on the
random pair against the cost model gamma * t_draft + t_verify (what the loop adds beyond the models).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

import jaxspec
from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec.bench import costs, presets, timing
from jaxspec.models import t5
from jaxspec.tools.outputs import markdown_table, progress

COST_HEADER = ["batch", "draft", "gamma", "target step (ms)", "r", "draft step (ms)", "c", "paper alpha",
               "expected (c, r)", "expected (r = 1)", "paper speedup"]
LOOP_HEADER = ["draft", "gamma", "plain ms/step (loop)", "target step (model)", "speculative ms/iteration (loop)",
               "gamma t_draft + t_verify (model)", "loop / model"]


def random_model(shape: str, dtype, seed: int = 0) -> jaxspec.Model:
  """A public T5 shape ('t5-small' ... 't5-11b') with random weights, initialised leaf by leaf in `dtype`."""
  return jaxspec.Model.random(t5.T5Config(**T5_SHAPES[shape]), seed, dtype, name=shape)


def loop_overhead(target, draft, gamma: int, step: dict, repeats: int) -> dict:
  """generate() on the random pair at batch 1: ms per iteration, against the cost model's."""
  ids = np.random.RandomState(0).randint(3, 32000, size=(1, 24)).tolist()
  row = {}
  for name, d in (("plain", None), ("speculative", draft)):
    speculation = None if d is None else jaxspec.Speculation(d, gamma=gamma)
    run = lambda s=speculation: jaxspec.generate(target, ids, s, max_new_tokens=64)
    out = run()  # Compilation (and the iteration counts: greedy, so every call does the same).
    seconds = timing.median_time(run, repeats, warmup=0)
    it = int(out.stats.iterations.sum())
    row[name] = {"s": seconds, "iterations": it, "tokens": int(out.stats.generated.sum()),
                 "ms_per_iteration": seconds / it * 1e3}
  row["model_ms_plain"] = step["target_step_s"] * 1e3
  row["model_ms_speculative"] = (gamma * step["draft_step_s"] + step["target_verify_s"]) * 1e3
  return row


def sweep(target_shape: str, draft_shapes: Sequence[str], gammas: Sequence[int], batch_sizes: Sequence[int], dtype,
          repeats: int, loop: bool) -> tuple[dict, list[str]]:
  """({"target", "rows", "loop"}, markdown lines): cost rows per (draft, batch, gamma) and loop rows."""
  target = random_model(target_shape, dtype)
  print(target, flush=True)
  rows, loop_rows, table = [], [], []
  bar = progress(len(draft_shapes) * len(batch_sizes), "hardware costs", unit="point")
  for draft_shape in draft_shapes:
    draft = random_model(draft_shape, dtype, seed=1)
    bar.write(repr(draft))
    paper = presets.paper_row_for("ende", draft_shape, 0)
    for batch in batch_sizes:
      measured = costs.cost_table(target, draft, gammas, batch, repeats=repeats, rounds=1, alternating=False)
      for g, m in measured.items():
        row = {"batch": batch, "draft": draft_shape, "gamma": g, **m,
               "paper_alpha": paper.alpha if paper else float("nan"),
               "paper_gamma": paper.gamma if paper else None, "paper_speedup": paper.speedup if paper else None}
        if paper:
          row["expected"] = jaxspec.expected_speedup(paper.alpha, g, m["c"], m["r"])
          row["expected_r1"] = jaxspec.expected_speedup(paper.alpha, g, m["c"])
        rows.append(row)
        table.append([batch, draft_shape, g, f"{m['target_step_s'] * 1e3:.2f}", f"{m['r']:.3f}",
                      f"{m['draft_step_s'] * 1e3:.3f}", f"{m['c']:.3f}", f"{row['paper_alpha']:.2f}",
                      f"{row.get('expected', 0):.2f}", f"{row.get('expected_r1', 0):.2f}", row["paper_speedup"] or "-"])
        bar.write(" | ".join(map(str, table[-1])))
      if loop and batch == 1 and paper:
        g = paper.gamma if paper.gamma in measured else max(measured)
        loop_rows.append({"draft": draft_shape, "gamma": g, **loop_overhead(target, draft, g, measured[g], repeats)})
        bar.write(f"loop {draft_shape} gamma {g}: {loop_rows[-1]}")
      bar.update(1)
    del draft
  bar.close()
  lines = markdown_table(COST_HEADER, table) + [""] + markdown_table(LOOP_HEADER, [
      [r["draft"], r["gamma"], f"{r['plain']['ms_per_iteration']:.2f}", f"{r['model_ms_plain']:.2f}",
       f"{r['speculative']['ms_per_iteration']:.2f}", f"{r['model_ms_speculative']:.2f}",
       f"{r['speculative']['ms_per_iteration'] / r['model_ms_speculative']:.2f}"] for r in loop_rows])
  return {"target": target_shape, "rows": rows, "loop": loop_rows}, lines
