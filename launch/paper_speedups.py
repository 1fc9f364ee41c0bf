r"""The paper's Table 2 speedups on this machine, without pretrained weights (random T5 shapes, oracle drafts).

    python launch/paper_speedups.py                                    # EnDe small/base/large rows, T5-XXL target
    python launch/paper_speedups.py --rows=ende_small_t0 --target=t5-large --dtype=float32 --max_new_tokens=32

Each row's draft (a random T5 of the row's shape) runs inside `jaxspec.bench.oracle.OracleDecoder`: it costs
what that draft costs and the target accepts its tokens i.i.d. at the paper's alpha for the row, so the measured
speedup is the paper's setting with this machine's costs (`jaxspec.bench.paper_speedups`). Temperature-0 rows
only: when sampling, acceptance depends on the distributions, not on alpha. Writes OUTPUT.json and OUTPUT.md.
"""

import json
import os
import platform

import jax
import jax.numpy as jnp
from absl import app, flags

from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec.bench import presets
from jaxspec.bench import paper_speedups
from jaxspec.tools.outputs import markdown_table

_ROWS = flags.DEFINE_list("rows", ["ende_small_t0", "ende_base_t0", "ende_large_t0"], "Table 2 rows (temperature 0).")
_TARGET = flags.DEFINE_enum("target", "t5-11b", list(T5_SHAPES), "Target shape.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Parameter dtype.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per input (no EOS: every input runs them all).")
_INPUTS = flags.DEFINE_integer("inputs", 2, "Batch-1 inputs, each with its own acceptance pattern.")
_INPUT_LENGTH = flags.DEFINE_integer("input_length", 40, "Tokens per input (random ids).")
_BUCKET = flags.DEFINE_integer("bucket", 64, "Padded input length (the engine's bucket for input_length).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds over the inputs (the median round is reported).")
_OUT = flags.DEFINE_string("output", "docs/bench/h100/paper_speedups", "Writes OUTPUT.json and OUTPUT.md.")


def main(argv):
  del argv
  rows = [presets.paper_row(name) for name in _ROWS.value]
  if any(r.temperature != 0 for r in rows):
    raise app.UsageError("--rows: only temperature-0 rows are meaningful with an oracle draft.")
  print(f"JAX {jax.__version__}, devices: {jax.devices()}", flush=True)
  result = paper_speedups.sweep(_TARGET.value, rows, jnp.dtype(_DTYPE.value), _MAX_NEW.value, _INPUTS.value,
                                _INPUT_LENGTH.value, _BUCKET.value, _REPEATS.value)
  result["machine"] = {"device": jax.devices()[0].device_kind, "platform": platform.platform(),
                       "jax": jax.__version__, "dtype": _DTYPE.value}
  result["settings"] = {"max_new_tokens": _MAX_NEW.value, "inputs": _INPUTS.value, "bucket": _BUCKET.value,
                        "input_length": _INPUT_LENGTH.value, "repeats": _REPEATS.value}
  lines = markdown_table(paper_speedups.HEADER, [paper_speedups.table_row(m) for m in result["rows"]])
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(_OUT.value + ".md", "w") as f:
    f.write(f"Target {_TARGET.value} ({_DTYPE.value}, random weights), oracle drafts, batch 1, "
            f"{_MAX_NEW.value} new tokens per input, {_INPUTS.value} inputs of {_INPUT_LENGTH.value} tokens; "
            f"{result['machine']['device']}, JAX {jax.__version__}.\n\n" + "\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
