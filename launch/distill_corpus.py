r"""Sequence-level distillation data: the target's greedy translations of training sources, as an EN-DE TSV.

    python launch/distill_corpus.py --target=runs/target/export --output=runs/distill/train.tsv.gz \
        --max_pairs=40000 --domains=natural,documentation,software

A draft trained on these pairs (`--config.train=` that file) learns to predict what the target will say, which
is what acceptance measures (Kim & Rush 2016). Sources (the --domains in that order of priority, deduplicated, at
most --max_len tokens) are translated in length-sorted batches, so padding stays small. Each row keeps its
source's domain (source column "distilled:<original source>"). Rows are written as the batches finish; a rerun
continues after the last complete row in --output (a row cut short by a kill is redone).
"""

from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags
from jaxspec.data.ende import DOMAINS, default_data_dir, distillation_sources, read_pairs, split_path
from jaxspec.tools.outputs import LineWriter
from jaxspec.training.loop import distill

cli_flags.define_models(draft=None)
_TRAIN = flags.DEFINE_string("train", "train", "Source pairs (only 'en' is used): 'train' of --data_dir or a TSV.")
_DATA = flags.DEFINE_string("data_dir", "", f"EN-DE corpus directory ('' = {default_data_dir()}).")
_OUTPUT = flags.DEFINE_string("output", None, "Where the distilled pairs go (a .tsv.gz).", required=True)
_MAX_PAIRS = flags.DEFINE_integer("max_pairs", 40000, "Sources to translate at most (by --domains priority).",
                                  lower_bound=1)
_DOMAINS = flags.DEFINE_list("domains", list(DOMAINS), f"Domains to translate, by priority (of {', '.join(DOMAINS)}).")
_NATURAL_ONLY = flags.DEFINE_boolean("natural_only", False, "Only the natural sentences (same as --domains=natural).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Sentences per generate call.", lower_bound=1)
_MAX_LEN = flags.DEFINE_integer("max_len", 64, "Longest source kept and longest output, in tokens.", lower_bound=2)
flags.register_validator("domains", lambda v: bool(v) and set(v) <= set(DOMAINS),
                         message=f"--domains takes some of {', '.join(DOMAINS)}")
HEADER = "en\tde\tsource"


def main(argv):
  del argv
  pairs = read_pairs(split_path(_TRAIN.value, _DATA.value))
  target = jaxspec.load(flags.FLAGS.target)
  domains = ("natural",) if _NATURAL_ONLY.value else tuple(_DOMAINS.value)
  sources = distillation_sources(pairs, _MAX_PAIRS.value, domains)
  kept = sum(len(ids) <= _MAX_LEN.value for ids in target.tokenizer.hf_tokenizer([p.en for p in sources])["input_ids"])
  writer = LineWriter(_OUTPUT.value, kept, header=HEADER, escape=False)  # distill's rows hold no tab, no newline.
  print(f"{kept} sources, {writer.done} already written", flush=True)
  distill(target, sources, batch_size=_BATCH.value, max_len=_MAX_LEN.value, start=writer.done,
          on_rows=lambda rows: writer.write(["\t".join((p.en, p.de, p.source)) for p in rows]))
  print(f"{kept} distilled pairs in {_OUTPUT.value}")


if __name__ == "__main__":
  cli_flags.run(main)
