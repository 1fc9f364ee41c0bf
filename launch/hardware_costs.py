r"""The paper's cost ratios on this machine for its model shapes: c and r with random weights, no checkpoints.

    python launch/hardware_costs.py                        # T5-XXL (t5-11b) target, t5-small/base/large drafts
    python launch/hardware_costs.py --target=t5-large --drafts=t5-small --dtype=float32 --batch_sizes=1

Random weights have the real shapes (`jaxspec.models.t5.shapes.T5_SHAPES`), so they cost what the real checkpoints cost.
For each batch size: the target's decoder step on 1 and on gamma + 1 tokens (r), each draft's 1-token step (c),
Theorem 3.8's expected speedup at the paper's alpha next to the paper's speedup, and the real speculative loop
on the random pair against the cost model gamma * t_draft + t_verify (`jaxspec.bench.hardware`). Writes
OUTPUT.json and OUTPUT.md (aligned markdown) and prints where they are.
"""

import platform

import jax
import jax.numpy as jnp
from absl import flags

from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec.cli import flags as cli_flags
from jaxspec.bench import hardware
from jaxspec.tools.outputs import atomic_write, atomic_write_json

_TARGET = flags.DEFINE_enum("target", "t5-11b", list(T5_SHAPES), "Target shape.")
_DRAFTS = flags.DEFINE_multi_enum("drafts", ["t5-small", "t5-base", "t5-large"], list(T5_SHAPES),
                                  "Draft shapes (repeat the flag or separate by commas).")
cli_flags.define_number_list("gammas", [1, 2, 3, 5, 7], "Gammas (r is timed for each).", lower_bound=1)
cli_flags.define_number_list("batch_sizes", [1, 16], "Batch sizes.", lower_bound=1)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Parameter dtype.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per step time (the median is reported).",
                                lower_bound=1)
_LOOP = flags.DEFINE_boolean("loop", True, "Also time the speculative loop on the random pair (batch 1).")
_OUT = flags.DEFINE_string("output", "docs/bench/hardware_costs", "Writes OUTPUT.json and OUTPUT.md.")


def main(argv):
  del argv
  print(f"devices: {jax.devices()}", flush=True)
  drafts = [d for arg in _DRAFTS.value for d in arg.split(",")]
  results, lines = hardware.sweep(_TARGET.value, drafts, flags.FLAGS.gammas, flags.FLAGS.batch_sizes,
                                  jnp.dtype(_DTYPE.value), _REPEATS.value, _LOOP.value)
  device = str(jax.devices()[0].device_kind)
  results["machine"] = {"device": device, "platform": platform.platform(), "jax": jax.__version__,
                        "dtype": _DTYPE.value}
  atomic_write_json(_OUT.value + ".json", results, indent=1)
  atomic_write(_OUT.value + ".md", f"Target {_TARGET.value} ({_DTYPE.value}, random weights) on {device}, "
               f"JAX {jax.__version__}.\n\n" + "\n".join(lines) + "\n")
  print("\n".join(lines))
  print(f"written: {_OUT.value}.json, {_OUT.value}.md")


if __name__ == "__main__":
  cli_flags.run(main)
