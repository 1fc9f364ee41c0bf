r"""BLEU and chrF of the target, the draft and speculative decoding on EN-DE splits, per domain (sacrebleu, greedy).

    python launch/evaluate.py --split=test,test_doc --data_dir=/work/corpus --limit_per_domain=256 \
        --max_new_tokens=96 --output=docs/ende_pair_eval.json
    python launch/evaluate.py --split=dev --natural_only --limit=256           # the alpha bar
    python launch/evaluate.py --split=my_pairs.tsv --data_dir=DIR

--split is one or more (comma-separated) of 'train', 'dev', 'test', 'dev_doc', 'test_doc' of --data_dir, or TSV
paths; their pairs with both sides non-empty count. Domains (natural sentences, documentation, software strings)
come from each pair's source column. At temperature 0 the speculative output must equal the target's exactly;
the script checks it line by line.
"""

from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags
from jaxspec.bench import quality
from jaxspec.data.ende import default_data_dir, read_splits, split_path
from jaxspec.tools.outputs import atomic_write_json

cli_flags.define_models()
cli_flags.define_decoding(gamma=3, batch_size=64, max_new_tokens=64, max_input_length=128)
_SPLIT = flags.DEFINE_string("split", "test", "Comma-separated splits of --data_dir ('test,test_doc') or TSV paths.")
_DATA = flags.DEFINE_string("data_dir", "", f"EN-DE corpus directory ('' = {default_data_dir()}).")
_NATURAL = flags.DEFINE_boolean("natural_only", False, "Only the natural sentences (Ding examples) of the split.")
_LIMIT = flags.DEFINE_integer("limit", 0, "Evaluate N evenly spaced pairs only (0 = all).", lower_bound=0)
_PER_DOMAIN = flags.DEFINE_integer("limit_per_domain", 0, "At most N evenly spaced pairs of each domain (0 = all).",
                                   lower_bound=0)
_OUTPUT = flags.DEFINE_string("output", "", "JSON file for the results.")


def main(argv):
  del argv
  pairs = read_splits(_SPLIT.value, _DATA.value)
  target, draft = jaxspec.load(flags.FLAGS.target), jaxspec.load(flags.FLAGS.draft)
  results = quality.evaluate_pair(target, draft, pairs, natural_only=_NATURAL.value, limit=_LIMIT.value,
                                  limit_per_domain=_PER_DOMAIN.value, gamma=flags.FLAGS.gamma,
                                  sampling=cli_flags.sampling(), **cli_flags.run_kwargs())
  results["split"] = ",".join(split_path(s.strip(), _DATA.value) for s in _SPLIT.value.split(",") if s.strip())
  print("\n".join(quality.table(results)))
  print(f"speculative output identical to the target's on {results['speculative_identical_to_target']} sentences")
  if _OUTPUT.value:
    atomic_write_json(_OUTPUT.value, results, indent=2)
    print(f"results written to {_OUTPUT.value}")
  if not quality.all_identical(results):
    raise SystemExit("speculative greedy output differs from the target's")


if __name__ == "__main__":
  cli_flags.run(main)
