r"""The paper's cost ratios on this machine for its model shapes: c and r with random weights, no checkpoints.

    python launch/hardware_costs.py                        # T5-XXL (t5-11b) target, t5-small/base/large drafts
    python launch/hardware_costs.py --target=t5-large --drafts=t5-small --dtype=float32 --batch_sizes=1

Random weights have the real shapes, so they cost what the real checkpoints cost; only alpha needs trained
models. For each batch size it times the target's decoder step on 1 and on gamma + 1 tokens (r) and each
draft's 1-token step (c), then gives Theorem 3.8's expected speedup at the paper's measured alpha for that pair
(configs/paper_t5.py) next to the paper's own speedup. It also runs the real speculative loop on the random pair
at the paper's gamma and compares its time per iteration with the cost model gamma * t_draft + t_verify: what
the loop adds beyond the models. (Random pairs accept all or none of a block, depending on the shapes: the JSON
gives iterations and tokens.) Writes JSON and a markdown table.
"""

import importlib.util
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import jaxspec
from jaxspec import benchmarking
from jaxspec.decoding import theory
from jaxspec.models import t5

_spec = importlib.util.spec_from_file_location(
    "paper_t5", os.path.join(os.path.dirname(__file__), "..", "configs", "paper_t5.py"))
paper_t5 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_t5)

# The public T5 1.0 checkpoints' shapes (their config.json files): ReLU, tied and scaled embedding, 32128 ids.
SHAPES = {
    "t5-small": dict(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8),
    "t5-base": dict(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12),
    "t5-large": dict(d_model=1024, d_kv=64, d_ff=4096, num_layers=24, num_decoder_layers=24, num_heads=16),
    "t5-3b": dict(d_model=1024, d_kv=128, d_ff=16384, num_layers=24, num_decoder_layers=24, num_heads=32),
    "t5-11b": dict(d_model=1024, d_kv=128, d_ff=65536, num_layers=24, num_decoder_layers=24, num_heads=128),
}

_TARGET = flags.DEFINE_enum("target", "t5-11b", list(SHAPES), "Target shape.")
_DRAFTS = flags.DEFINE_list("drafts", ["t5-small", "t5-base", "t5-large"], "Draft shapes.")
_GAMMAS = flags.DEFINE_list("gammas", ["1", "2", "3", "5", "7"], "Gammas (r is timed for each).")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "16"], "Batch sizes.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Parameter dtype.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per step time (the median is reported).")
_LOOP = flags.DEFINE_boolean("loop", True, "Also time the speculative loop on the random pair (batch 1).")
_OUT = flags.DEFINE_string("output", "docs/bench/hardware_costs", "Writes OUTPUT.json and OUTPUT.md.")


def random_model(shape: str, dtype, seed: int = 0) -> jaxspec.Model:
  cfg = t5.T5Config(**SHAPES[shape])
  params = t5.init_params(cfg, jax.random.key(seed), dtype)  # Leaf by leaf: float32 temporaries stay small.
  return jaxspec.Model(cfg, params, None, shape)


def _loop_overhead(target, draft, gamma: int, step: dict) -> dict:
  """Times generate() on the random pair at batch 1 and compares ms per iteration with the cost model."""
  ids = np.random.RandomState(0).randint(3, 32000, size=(1, 24)).tolist()
  run = lambda d: jaxspec.generate(target, ids, draft=d, gamma=gamma, max_new_tokens=64)
  row = {}
  for name, d in (("plain", None), ("speculative", draft)):
    run(d)  # compilation
    times = []
    for _ in range(_REPEATS.value):
      start = time.perf_counter()
      out = run(d)
      times.append(time.perf_counter() - start)
    it = int(out.stats.iterations.sum())
    row[name] = {"s": float(np.median(times)), "iterations": it, "tokens": int(out.stats.generated.sum()),
                 "ms_per_iteration": float(np.median(times)) / it * 1e3}
  row["model_ms_plain"] = step["target_step_s"] * 1e3
  row["model_ms_speculative"] = (gamma * step["draft_step_s"] + step["target_verify_s"]) * 1e3
  return row


def main(argv):
  del argv
  dtype = jnp.dtype(_DTYPE.value)
  gammas = [int(g) for g in _GAMMAS.value]
  print(f"devices: {jax.devices()}", flush=True)
  target = random_model(_TARGET.value, dtype)
  print(target, flush=True)
  results = {"machine": {"device": str(jax.devices()[0].device_kind), "platform": platform.platform(),
                         "jax": jax.__version__, "dtype": _DTYPE.value},
             "target": _TARGET.value, "rows": []}
  lines = ["| batch | draft | gamma | target step (ms) | r | draft step (ms) | c | paper alpha | expected (c, r) "
           "| expected (r = 1) | paper speedup |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  loop_rows = []
  for draft_shape in _DRAFTS.value:
    draft = random_model(draft_shape, dtype, seed=1)
    print(draft, flush=True)
    paper = paper_t5.TABLE2.get(("ende", draft_shape.split("-")[1], 0))  # (gamma, alpha, speedup, c) or None
    for batch in (int(b) for b in _BATCHES.value):
      table = benchmarking.cost_table(target, draft, gammas, batch, repeats=_REPEATS.value, rounds=1,
                                      alternating=False)
      for g, m in table.items():
        alpha = paper[1] if paper else float("nan")
        row = {"batch": batch, "draft": draft_shape, "gamma": g, **m, "paper_alpha": alpha,
               "paper_gamma": paper[0] if paper else None, "paper_speedup": paper[2] if paper else None}
        if paper:
          row["expected"] = theory.expected_speedup(alpha, g, m["c"], m["r"])
          row["expected_r1"] = theory.expected_speedup(alpha, g, m["c"])
        results["rows"].append(row)
        lines.append(f"| {batch} | {draft_shape} | {g} | {m['target_step_s'] * 1e3:.2f} | {m['r']:.3f} | "
                     f"{m['draft_step_s'] * 1e3:.3f} | {m['c']:.3f} | {alpha:.2f} | {row.get('expected', 0):.2f} | "
                     f"{row.get('expected_r1', 0):.2f} | {row['paper_speedup'] or '-'} |")
        print(lines[-1], flush=True)
      if _LOOP.value and batch == 1 and paper:
        g = paper[0] if paper[0] in table else max(table)
        loop = _loop_overhead(target, draft, g, table[g])
        loop_rows.append({"draft": draft_shape, "gamma": g, **loop})
        print(f"loop {draft_shape} gamma {g}: {loop}", flush=True)
    del draft
  results["loop"] = loop_rows
  lines += ["", "| draft | gamma | plain ms/step (loop) | target step (model) | speculative ms/iteration (loop) "
            "| gamma t_draft + t_verify (model) | loop / model |", "|---|---|---|---|---|---|---|"]
  for r in loop_rows:
    lines.append(f"| {r['draft']} | {r['gamma']} | {r['plain']['ms_per_iteration']:.2f} | "
                 f"{r['model_ms_plain']:.2f} | {r['speculative']['ms_per_iteration']:.2f} | "
                 f"{r['model_ms_speculative']:.2f} | "
                 f"{r['speculative']['ms_per_iteration'] / r['model_ms_speculative']:.2f} |")
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value + ".json", "w") as f:
    json.dump(results, f, indent=1)
  with open(_OUT.value + ".md", "w") as f:
    f.write(f"Target {_TARGET.value} ({_DTYPE.value}, random weights) on {results['machine']['device']}, "
            f"JAX {jax.__version__}.\n\n" + "\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
