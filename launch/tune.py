r"""Which draft, gamma and schedule decode fastest here: the tuner (`jaxspec.tune`) over a pool of drafts.

    python launch/tune.py                                        # embedded pair + n-gram, dev sentences
    python launch/tune.py --drafts=ende-draft,ngram,random:ende-draft --gammas=1,2,3,4,6 --batch_sizes=1,4 \
        --temperatures=0,1 --output_dir=docs/bench/adaptive/tune
    python launch/tune.py --target=/ckpt/t5-large --drafts=/ckpt/t5-small,ngram --input=news.en --prefix=...
    python launch/tune.py --target=/ckpt/llama-3.1-8b --drafts=/ckpt/eagle3-llama-3.1-8b,ngram --input=prompts.txt

A draft is a model, prompt lookup or an EAGLE-3 feature head (a `jaxspec.FeatureHead`: a directory in SpecForge's
format, checked against --target before anything is timed; docs/heads.md). For every draft x gamma x schedule
(constant, and adaptive with knobs from the measured costs) x batch size x temperature, timed against plain decoding
side by side: tokens/s, ms/token plain and speculative, the speedup, alpha, tau, acceptance per position, draft
lengths and fallback share, the draft's ms/token, c, r, Theorem 3.8's prediction, latency percentiles per sequence
and inter-token latency (a separate streaming pass), and BLEU/chrF against the references when the input is an EN-DE
TSV (its 'de' column). Then the best choice per (batch size, temperature), plain decoding when nothing wins by
--min_speedup. Writes tune.json, tune.md (aligned markdown), speedup_vs_gamma.png and acceptance.png to --output_dir
and prints where they are; with --speculation_table also the slot engine's load table (launch/serve.py), a path
checked before anything loads: never the input, a file of --output_dir or an existing file that is no table.
"""

import os

from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags, jobs, resume
from jaxspec.bench import report, tune
from jaxspec.data.ende import read_pairs, split_path
from jaxspec.errors import JaxspecError, OutputError, SettingsError
from jaxspec.serving.table import SpeculationTable
from jaxspec.tools.inputs import InputError, encode_texts, is_tsv, read_corpus_texts
from jaxspec.tools.outputs import atomic_write

flags.DEFINE_string("target", "ende-target", "Target model: an embedded name or a model directory.")
_DRAFTS = flags.DEFINE_string("drafts", "ende-draft,ngram", "Comma-separated drafts: embedded names, model "
                              "directories, EAGLE-3 head directories (SpecForge's format, trained on --target), "
                              "'ngram' (prompt lookup) or 'random:NAME' (NAME's shape, random weights).")
_INPUT = flags.DEFINE_string("input", "dev", "'dev' / 'test' of --data_dir, an EN-DE TSV (references from its 'de' "
                             "column) or a text file (one input a line; no references).")
_DATA = flags.DEFINE_string("data_dir", "", "EN-DE corpus directory ('' = jaxspec.data.ende.default_data_dir()).")
_NATURAL = flags.DEFINE_boolean("natural_only", True, "From a corpus TSV, keep the natural sentences only.")
_PREFIX = flags.DEFINE_string("prefix", "", "Text put before each input (T5's task prefix).")
_SENTENCES = flags.DEFINE_integer("sentences", 16, "Inputs used (the first N).", lower_bound=1)
cli_flags.define_number_list("gammas", [1, 2, 3, 4, 6], "Gammas to try.", lower_bound=1)
_SCHEDULES = flags.DEFINE_list("schedules", ["constant", "adaptive"], "Schedules to try: constant, adaptive, "
                               "heuristic.")
_TREES = flags.DEFINE_string("trees", "", "Token-tree shapes to try 'K,N:K,N' (top_k, nodes; with draft models and "
                             "prompt lookup, at every gamma deep enough); '' = chains only.")
cli_flags.define_number_list("temperatures", [0.0], "Temperatures.", kind=float)
cli_flags.define_number_list("batch_sizes", [1], "Batch sizes.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed passes per variant (the median is reported).", lower_bound=1)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens generated per input at most.", lower_bound=1)
_ITL = flags.DEFINE_boolean("itl", True, "One more streaming pass per variant for inter-token latencies.")
_MIN = flags.DEFINE_float("min_speedup", tune.MIN_SPEEDUP, "Speedup a variant needs over plain "
                          "decoding to be chosen.")
_OUT = flags.DEFINE_string("output_dir", "runs/tune", "Where tune.json, tune.md and the plots go (the committed "
                           "results in docs/bench are written only when named).")
_TABLE = flags.DEFINE_string("speculation_table", "", "Also write the slot engine's load table (draft length, tree "
                             "or plain per number of active slots, from the 'constant' and tree rows of "
                             "--batch_sizes; the first draft and temperature) to this JSON file, for "
                             "launch/serve.py --speculation_table. An existing file is replaced only when it is such "
                             "a table (checked before anything is timed).")
flags.register_validator("schedules", lambda v: bool(v) and set(v) <= set(tune.SCHEDULES),
                         message=f"--schedules must be some of {tune.SCHEDULES}")
FLAGS = flags.FLAGS


def _inputs(target) -> tuple[list[list[int]], list[str] | None]:
  """Token ids of the first --sentences inputs and their references (None without a 'de' column)."""
  spec = _input_path()
  if is_tsv(spec):
    pairs = [p for p in read_pairs(spec) if p.is_natural or not _NATURAL.value][:_SENTENCES.value]
    texts, refs = [p.en for p in pairs], [p.de for p in pairs]
  else:
    texts, refs = read_corpus_texts(spec, _NATURAL.value)[:_SENTENCES.value], None
  if not texts:
    raise InputError(f"--input {spec}: no non-empty inputs.")
  return encode_texts(target.tokenizer, texts, prefix=_PREFIX.value, max_input_length=512), refs


def _input_path() -> str:
  return split_path(_INPUT.value, _DATA.value) if _INPUT.value in ("train", "dev", "test") else _INPUT.value


def _check_table(path: str) -> None:
  """--speculation_table, before anything loads or is timed: a file in an existing directory that is neither the
  input nor one of the files written to --output_dir, and replaced only when it holds a table already (an
  earlier run's); the sweep must have rows the table is made of (schedule 'constant' or trees)."""
  flag = f"--speculation_table={path}"
  if os.path.isdir(path) or not os.path.isdir(os.path.dirname(os.path.abspath(path))):
    raise InputError(f"{flag}: must name a file in an existing directory.")
  resume.check_output_file(path, "--speculation_table")
  if os.path.exists(_input_path()) and resume.same_file(path, _input_path()):
    raise OutputError(f"{flag} is the --input file: the table would replace the inputs; choose another path.")
  for name in report.TUNE_FILES:
    if os.path.realpath(path) == os.path.realpath(os.path.join(_OUT.value, name)):
      raise OutputError(f"{flag} is {name} of --output_dir, which this run writes; choose another path.")
  if os.path.exists(path) and os.path.getsize(path) > 0:
    try:
      SpeculationTable.read(path)
    except JaxspecError as e:
      raise OutputError(f"{flag} exists and is not a speculation table ({str(e).removeprefix(path + ': ')}): "
                        "refusing to replace it; remove it or choose another path.") from None
  if "constant" not in _SCHEDULES.value and not _TREES.value.strip():
    raise SettingsError(f"{flag} is made of 'constant' chain or tree rows (what the slot engine runs), but "
                        f"--schedules={','.join(_SCHEDULES.value)} and no --trees sweep none: add 'constant' to "
                        "--schedules or give --trees.")


def main(argv):
  del argv
  resume.check_output_dir(_OUT.value)  # Before loading, tuning and timing: not a lost run at the end.
  if _TABLE.value:
    _check_table(_TABLE.value)
  target = jobs.load_target(FLAGS.target)
  drafts = jobs.load_drafts(_DRAFTS.value, target)
  if not drafts:
    raise InputError("--drafts: name at least one draft.")
  ids, refs = _inputs(target)
  result = jaxspec.tune(target, drafts, ids, gammas=FLAGS.gammas, batch_sizes=FLAGS.batch_sizes,
                        temperatures=FLAGS.temperatures, schedules=_SCHEDULES.value,
                        trees=cli_flags.parse_trees(_TREES.value), references=refs,
                        repeats=_REPEATS.value, max_new_tokens=_MAX_NEW.value, itl=_ITL.value,
                        min_speedup=_MIN.value)
  paths = report.write_tune(_OUT.value, result)
  print(report.tune_markdown(result))
  print("written: " + ", ".join(f"{kind} {path}" for kind, path in paths.items()))
  if _TABLE.value:
    table = tune.speculation_table(result.rows, draft=result.rows[0]["draft"],
                                   temperature=float(FLAGS.temperatures[0]), min_speedup=_MIN.value)
    atomic_write(_TABLE.value, table.to_json())
    print(f"speculation table ({_TABLE.value}): {table}")


if __name__ == "__main__":
  cli_flags.run(main)
