r"""The main job: English -> German with a T5 target and a T5 draft, speculatively, next to plain decoding.

    python launch/translate.py                                  # embedded pair, built-in sample sentences
    python launch/translate.py --input=news.txt --output=news.de.txt --gamma=3
    echo "The house is small." | python launch/translate.py --input=- --nocompare
    python launch/translate.py --target=/path/to/t5-11b --draft=/path/to/t5-small \
        --prefix="translate English to German: " --input=newstest2014.en
    python launch/translate.py --draft=ende-draft,ngram --gamma=auto     # a pool: the choice measured first
    python launch/translate.py --target=DIR --draft=HEAD_DIR,DRAFT_DIR --gamma=auto   # a pool with an EAGLE-3 head

Inputs (`jaxspec.tools.inputs`): every line of a text file or stdin, or every row after a TSV's header (its 'en'
column), is one input and gives exactly one output line (an empty input, an empty line). Prints the
translations, or writes them to --output as they are made (a rerun resumes after the last complete line, only
of a file this script wrote with the same input lines and settings: `jaxspec.cli.resume`), then a
summary: alpha, tokens per iteration, acceptance per draft position, wall time per token of plain and speculative
decoding measured side by side (compilation excluded), the speedup, the speedup Theorem 3.8 predicts from the
measured alpha, c and r, and at temperature 0 whether both outputs are identical. Line i is sampled with a seed
derived from --seed and i, so neither the batch size nor a resume point changes it.

--draft takes comma-separated drafts: model names or directories, EAGLE-3 head directories (a `jaxspec.FeatureHead`
trained on --target: it drafts from the target's hidden states; docs/heads.md), 'ngram' (prompt lookup,
`jaxspec.NGramDraft`) or 'random:NAME' (NAME's shape with random weights). With several drafts or --gamma=auto the
tuner (`jaxspec.tune`, via `jaxspec.cli.jobs.calibrate`) first times every draft x gamma (--tune_gammas, or --gamma)
x schedule (constant, adaptive) against plain decoding on up to --calibration_inputs of the inputs at this batch
size and temperature, prints its table, the choice and why, and translates everything with that choice (plain
decoding when no variant is faster).
"""

import os

from absl import flags

import jaxspec
from jaxspec.bench.tune import TREE_SHAPES
from jaxspec.cli import flags as cli_flags, jobs, resume
from jaxspec.tools.inputs import InputError, read_texts

cli_flags.define_models()
cli_flags.define_decoding(gamma=3, batch_size=1, max_new_tokens=64, max_input_length=128, auto_gamma=True)
cli_flags.define_sampling()
cli_flags.define_mesh()
resume.define_flags()
_INPUT = flags.DEFINE_string("input", "", "A text file (one sentence a line), a TSV whose header names an 'en' "
                             "column, '-' for stdin, or empty for the built-in sample.")
_OUTPUT = flags.DEFINE_string("output", "", "Where translations go, one line per input (resumable).")
_PREFIX = flags.DEFINE_string("prefix", "", "Text put before every input, e.g. 'translate English to German: '.")
_LONG = flags.DEFINE_enum("long_inputs", "truncate", ["truncate", "refuse"],
                          "Inputs longer than --max_input_length: truncate with a warning, or refuse to run.")
_COMPARE = flags.DEFINE_boolean("compare", True, "Also decode plainly and time both side by side.")
cli_flags.define_number_list("tune_gammas", [1, 2, 3, 4, 6], "Gammas the calibration tries (--gamma=auto).",
                             lower_bound=1)
_CALIBRATION = flags.DEFINE_integer("calibration_inputs", 16, "Inputs the calibration decodes (pool or "
                                    "--gamma=auto).", lower_bound=1)
FLAGS = flags.FLAGS

SAMPLE = os.path.join(os.path.dirname(jaxspec.__file__), "embedded", "samples", "ende_sample.tsv")


def main(argv):
  del argv
  mesh = cli_flags.mesh()
  texts = read_texts(_INPUT.value or SAMPLE)  # Input and output problems surface before any model loads.
  writer = jobs.open_output(_OUTPUT.value, texts, resume.record_from_flags(texts, _INPUT.value or SAMPLE),
                            input_spec=_INPUT.value or SAMPLE, allow_new_settings=FLAGS.resume_with_new_settings)
  target = jobs.load_target(FLAGS.target, mesh)
  drafts = jobs.load_drafts(FLAGS.draft, target, mesh)
  kw, sampling, gamma = cli_flags.run_kwargs(), cli_flags.sampling(), FLAGS.gamma
  trees = list(TREE_SHAPES) if FLAGS.tree == cli_flags.AUTO else [FLAGS.tree] if FLAGS.tree else []
  if gamma == cli_flags.AUTO or len(drafts) > 1 or FLAGS.tree == cli_flags.AUTO:
    if not drafts:
      raise InputError("--gamma=auto needs at least one --draft to choose from.")
    choice = jobs.calibrate(target, drafts, texts, gammas=FLAGS.tune_gammas if gamma == cli_flags.AUTO else [gamma],
                            prefix=_PREFIX.value, inputs=_CALIBRATION.value, sampling=sampling, trees=trees,
                            **{k: v for k, v in kw.items() if k != "seed"})
    speculation = choice.speculation
  else:
    speculation = cli_flags.speculation(next(iter(drafts.values()), None))
  run = jobs.generate_texts(texts, target, speculation, sampling, writer=writer, prefix=_PREFIX.value,
                            long_inputs=_LONG.value, compare=_COMPARE.value, desc="translate", **kw)
  if run is not None and run.identical is False:
    raise SystemExit("speculative and plain greedy outputs differ")


if __name__ == "__main__":
  cli_flags.run(main)
