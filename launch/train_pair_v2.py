r"""The v2 EN-DE pair in one accelerator call: target, distillation, draft, exports (docs/ende_pair.md, "v2").

    python launch/train_pair_v2.py --corpus=runs/corpus --out=$OUT     # ~9 minutes on one H100

The flags, one a `jaxspec.training.ende_pair.PairSettings` field of the same name, and `ende_pair.run`: the target
(--target_config, its budget capped to leave room for the rest), its distillation of dev and training sources and
its test BLEU/chrF, the draft (--draft_config) with KL to the target, alpha with time left; both models packed into
$OUT/<name>.tar.partNN, $OUT/summary.json after every stage, all of it ended by --deadline_s after the start
(jaxspec/training/ende_pair.py says what each stage writes). Bad input ends with one line before any model is built.
"""

import dataclasses
import os

from absl import flags

from jaxspec.cli import flags as cli_flags
from jaxspec.training import ende_pair
from jaxspec.training.ende_pair import PairSettings as D  # the defaults

CONFIGS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs"))
cli_flags.define_config_file("target_config", os.path.join(CONFIGS, "ende.py:target_v2"), "Target.")
cli_flags.define_config_file("draft_config", os.path.join(CONFIGS, "ende.py:draft_v2"), "Draft.")
flags.DEFINE_string("corpus", None, "Corpus directory (train.tsv.gz, dev/test(_doc).tsv).", required=True)
flags.DEFINE_string("workdir", D.workdir, "Directory for the stages' files.")
flags.DEFINE_string("out", os.environ.get("OUT", ""), "Where the packed models and summary.json go.")
flags.DEFINE_float("deadline_s", D.deadline_s, "Seconds after the start by which everything has ended.")
flags.DEFINE_float("distill_s", D.distill_s, "Seconds for distilling training sources.")
flags.DEFINE_integer("distill_pairs", D.distill_pairs, "Training sources to distil at most.")
flags.DEFINE_integer("dev_pairs", D.dev_pairs, "Dev sources distilled for the draft's dev loss.")
flags.DEFINE_integer("batch_size", D.batch_size, "Sentences per generate call (distillation, evaluation).")
flags.DEFINE_integer("eval_per_domain", D.eval_per_domain, "Test pairs per domain for the target's BLEU/chrF.")
flags.DEFINE_integer("alpha_sentences", D.alpha_sentences, "Natural dev sentences for the final alpha (0 = none).")
flags.DEFINE_integer("shard_bytes", D.shard_bytes, "Largest safetensors shard.")
flags.DEFINE_integer("part_bytes", D.part_bytes, "Largest archive part in --out.")


def main(argv):
  del argv
  ende_pair.run(D(**{f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(D)}))


if __name__ == "__main__":
  cli_flags.run(main)
