"""Why the v2 pair trained at ~3 steps/s on the H200 of 2026-11-28 (docs/experiments/pair_v2_h200_2026-11-28.md).

    python3 docs/experiments/train_step_probe.py --out=$OUT [--tiny]   # ~3.5 minutes on a GPU

One process, results written to OUT/probe.json after every part (a cut-off run still returns what it measured):
  1. dispatch: one jitted `x + 1` call, blocked on, per call (the host's and the runtime's fixed cost);
  2. kernels: one program of 64 dependent matmul + sine pairs (~128 kernels, no fusion across the matmuls), per
     kernel: the launch latency the sandbox adds;
  3. the v2 target's train step (configs/ende.py:target_v2: bfloat16, dropout 0.1, label smoothing 0.1) at
     [512 x 32] (the pipeline's batch), at [2048 x 32] (4x the tokens), and with float32 and no dropout (the first
     lease's settings, which ran ~50 steps/s of 16k tokens on an H100): compile seconds, ms per step (median of
     15 after 3 warm-up steps), tokens/s, and the kernels in the compiled program (instructions of its entry).
--tiny: a 2-layer d_model 64 model and small batches, to check the script on a CPU.
"""

import argparse
import importlib.util
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.models import t5
from jaxspec.training import steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(which: str):
  spec = importlib.util.spec_from_file_location("ende_config", os.path.join(ROOT, "configs", "ende.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(which)


def _median_ms(fn, warm: int, runs: int) -> float:
  for _ in range(warm):
    jax.block_until_ready(fn())
  times = []
  for _ in range(runs):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return round(1e3 * float(np.median(times)), 3)


def _kernels(compiled) -> int:
  """Instructions of the compiled program's entry computation (on a GPU each is about one kernel launch)."""
  text = compiled.as_text()
  entry = text[text.find("ENTRY"):]
  body = entry[:entry.find("\n}")]
  return sum(1 for line in body.splitlines()[1:] if "=" in line and "parameter(" not in line)


def probe_train_step(c, rows: int, length: int, tiny: bool) -> dict:
  cfg = t5.T5Config(vocab_size=8000 if not tiny else 512, **c.model)
  optimizer = steps.make_optimizer(c.learning_rate, c.warmup_steps, None, c.weight_decay)
  settings = steps.StepConfig(model=cfg, teacher=None, distill_weight=0.0, dropout_rate=c.dropout_rate,
                              label_smoothing=c.label_smoothing, compute_dtype=c.compute_dtype, seed=0)
  params = t5.init_params(cfg, jax.random.key(0))
  programs = steps.TrainPrograms(settings, optimizer, params, None, shapes=[(rows, length)]).start()
  programs.wait()
  state = {"params": params, "opt": optimizer.init(params)}
  rng = np.random.default_rng(0)
  inputs = rng.integers(2, cfg.vocab_size, (rows, length), dtype=np.int32)
  labels = rng.integers(2, cfg.vocab_size, (rows, length), dtype=np.int32)

  def one():
    state["params"], state["opt"], m = programs.step(state["params"], state["opt"], inputs, labels, None, 1, 1.0)
    return m["ce"]

  ms = _median_ms(one, 3, 15)
  return {"rows": rows, "length": length, "compute_dtype": c.compute_dtype, "dropout_rate": c.dropout_rate,
          "label_smoothing": c.label_smoothing, "compile_s": programs.seconds[programs.name(rows, length)],
          "ms_per_step": ms, "steps_per_s": round(1e3 / ms, 2), "tokens_per_s": round(2 * rows * length / ms * 1e3),
          "kernels": _kernels(programs.programs[(rows, length)])}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=os.environ.get("OUT", "runs/probe"))
  parser.add_argument("--tiny", action="store_true")
  parser.add_argument("--variants", default="", help="Only these [512 x 32] steps: dtype:dropout:smoothing,... "
                      "(e.g. float32:0.1:0.1,bfloat16:0:0), after the dispatch and kernel parts.")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  result = {"environment": {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
                            "jax": jax.__version__, "kernel": platform.release(),
                            "xla_flags": os.environ.get("XLA_FLAGS", "")}}

  def save():
    with open(os.path.join(args.out, "probe.json"), "w") as f:
      json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1), flush=True)

  save()
  x = jnp.ones((8,), jnp.float32)
  add = jax.jit(lambda v: v + 1)
  result["dispatch_ms"] = _median_ms(lambda: add(x), 10, 200)
  save()
  n = 256 if not args.tiny else 32
  w = jnp.eye(n, dtype=jnp.float32) * 0.5

  def chain(v):
    for _ in range(64):
      v = jnp.sin(v @ w)
    return v

  chained = jax.jit(chain)
  a = jnp.ones((n, n), jnp.float32)
  compiled = chained.lower(a).compile()
  ms = _median_ms(lambda: compiled(a), 3, 20)
  result["kernels_chain"] = {"kernels": _kernels(compiled), "ms_per_call": ms,
                             "us_per_kernel": round(1e3 * ms / max(_kernels(compiled), 1), 2)}
  save()
  c = _config("target_v2")
  if args.tiny:
    c.model = dict(c.model, d_model=64, d_ff=128, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=32)
  if args.variants:
    result["train_step"] = []
    for v in args.variants.split(","):
      dtype, dropout, smoothing = v.split(":")
      c.compute_dtype, c.dropout_rate, c.label_smoothing = dtype, float(dropout), float(smoothing)
      result["train_step"].append(probe_train_step(c, *((512, 32) if not args.tiny else (8, 16)), args.tiny))
      save()
    return
  shapes = [(512, 32), (2048, 32)] if not args.tiny else [(8, 16), (32, 16)]
  result["train_step"] = []
  for rows, length in shapes:
    result["train_step"].append(probe_train_step(c, rows, length, args.tiny))
    save()
  c.compute_dtype, c.dropout_rate, c.label_smoothing = "float32", 0.0, 0.0
  result["train_step"].append(probe_train_step(c, *shapes[0], args.tiny))
  save()


if __name__ == "__main__":
  main()
