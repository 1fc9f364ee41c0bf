r"""Issue 32 on a lent GPU in one prepared call: the oracle loop, the slot engine's step (issue 41 item 3), the
draft step's kernels, XLA's autotune level, then the pair's training with what is left (docs/accelerator.md has
how to run it and what each part answers).

    python launch/gpu_round3.py --out=$OUT                     # oracle, slots, kernels (7.8 min on an H200
                                                               # with --oracle_cases=llama); autotune is skipped
    python launch/gpu_round3.py --out=$OUT --stages=autotune   # autotune levels 4 and 0 (~3 min on an H200)
    python launch/gpu_round3.py --out=$OUT --stages=pair       # the pair alone (launch/train_pair_gpu.sh)
    python launch/gpu_round3.py --out=/tmp/r3 --tiny           # tiny shapes: the CPU test of this script

The flags, one a `jaxspec.bench.round3.Round3Settings` field of the same name, and `round3.run`: the stages in
order of value (--stages picks some of oracle, slots, kernels, autotune, pair; each is skipped when less than its
minimum is left of --budget_s; the pair needs runs/corpus and runs/wheels carried). Writes $OUT/round3.json (machine,
versions, command, every result, compiled programs per stage) and $OUT/round3.md (the tables), both rewritten
after every stage, and the pair's files under $OUT/pair/ (jaxspec/bench/round3.py says what each stage measures).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxspec.bench import round3  # noqa: E402
from jaxspec.bench.round3 import Round3Settings as D  # noqa: E402  (the defaults)
from jaxspec.errors import ConfigError  # noqa: E402

flags.DEFINE_string("out", os.environ.get("OUT", ""), "Output directory.")
flags.DEFINE_boolean("tiny", D.tiny, "Tiny shapes of the same families (the CPU test).")
flags.DEFINE_list("stages", list(D.stages), "Stages to run, in this order.")
flags.DEFINE_float("budget_s", D.budget_s, "Seconds for everything (a device call is cut at 600).")
flags.DEFINE_integer("max_new_tokens", D.max_new_tokens, "Tokens per oracle run (the paper's EnDe: 128).")
flags.DEFINE_integer("prompt_len", D.prompt_len, "Prompt tokens of the oracle runs.")
flags.DEFINE_integer("repeats", D.repeats, "Timed runs per measurement (median).")
flags.DEFINE_integer("train_steps", D.train_steps, "Timed train steps per program in the autotune stage.")
flags.DEFINE_list("oracle_cases", list(D.oracle_cases), "Oracle targets: ende (t5-11b), llama (8B shape).")
flags.DEFINE_list("kernel_variants", list(D.kernel_variants), "XLA flag variants (kernels).")
flags.DEFINE_list("slot_levels", [str(v) for v in D.slot_levels], "Row buckets of the slots stage (the largest "
                  "is the engine's slots).")
flags.DEFINE_list("autotune_levels", [str(v) for v in D.autotune_levels], "--xla_gpu_autotune_level values "
                  "(autotune).")


def main(argv):
  del argv
  values = {f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(D)}
  try:
    round3.run(D(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}))
  except ConfigError as e:  # an unknown stage
    raise app.UsageError(str(e)) from e


if __name__ == "__main__":
  app.run(main)
