r"""Sequence-level distillation data: the target's greedy translations of training sources, as an EN-DE TSV.

    python launch/distill_corpus.py --target=/tmp/work/target/export \
        --output=/tmp/work/distill/train.tsv.gz --natural_only=false --max_pairs=40000

A draft trained on these pairs (`--config.train=` that file) learns to predict what the target will say, which
is what acceptance measures (Kim & Rush 2016; the paper's drafts are off-the-shelf, ours can do better). Sources
are translated in length-sorted batches, so padding stays small. Rows are written as the batches finish and a
rerun continues after the rows already in --output (gzip appends are valid multi-member files).
"""

import gzip
import os
import time

from absl import app, flags

import jaxspec
from jaxspec.data.ende import read_pairs

_TARGET = flags.DEFINE_string("target", "ende-target", "The model whose outputs the draft will learn.")
_TRAIN = flags.DEFINE_string("train", "../shared/data/ende/train.tsv.gz", "Source pairs (only 'en' is used).")
_OUTPUT = flags.DEFINE_string("output", "/tmp/work/distill/train.tsv.gz", "Where the distilled pairs go.")
_MAX_PAIRS = flags.DEFINE_integer("max_pairs", 40000, "Sources to translate at most (natural sentences first).")
_NATURAL_ONLY = flags.DEFINE_boolean("natural_only", False, "Only the dictionary example sentences.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Sentences per generate call.")
_MAX_LEN = flags.DEFINE_integer("max_len", 64, "Longest source kept and longest output, in tokens.")


def choose_sources(pairs, max_pairs: int, natural_only: bool) -> list[str]:
  """Natural sentences first (the dev bar is measured on them), then software strings, deduplicated."""
  natural = [p.en for p in pairs if "(ding)" in p.source]
  software = [] if natural_only else [p.en for p in pairs if not "(ding)" in p.source]
  return list(dict.fromkeys(natural + software))[:max_pairs]


def main(argv):
  del argv
  target = jaxspec.load(_TARGET.value)
  sources = choose_sources(read_pairs(_TRAIN.value), _MAX_PAIRS.value, _NATURAL_ONLY.value)
  encoded = [(s, target.tokenizer.encode(s)) for s in sources]
  encoded = [(s, ids) for s, ids in encoded if len(ids) <= _MAX_LEN.value]
  encoded.sort(key=lambda e: len(e[1]))
  done = 0
  if os.path.exists(_OUTPUT.value):
    with gzip.open(_OUTPUT.value, "rt", encoding="utf-8") as f:
      done = max(sum(1 for _ in f) - 1, 0)
  else:
    os.makedirs(os.path.dirname(_OUTPUT.value) or ".", exist_ok=True)
    with gzip.open(_OUTPUT.value, "wt", encoding="utf-8") as f:
      f.write("en\tde\tsource\n")
  print(f"{len(encoded)} sources, {done} already written", flush=True)
  start = time.perf_counter()
  batch = _BATCH.value
  for k in range(done, len(encoded), batch):
    chunk = encoded[k:k + batch]
    ids = [e[1] for e in chunk]
    ids += [ids[-1]] * (batch - len(ids))  # A fixed batch size: one compilation per prompt bucket.
    out = jaxspec.generate(target, ids, max_new_tokens=_MAX_LEN.value, max_input_length=_MAX_LEN.value)
    with gzip.open(_OUTPUT.value, "at", encoding="utf-8") as f:
      for (src, _), text in zip(chunk, out.texts):
        f.write(f"{_clean(src)}\t{_clean(text) or '.'}\tdistilled\n")
    n = k + len(chunk)
    rate = (n - done) / (time.perf_counter() - start)
    print(f"{n}/{len(encoded)} sentences, {rate:.1f}/s, ETA {(len(encoded) - n) / rate / 60:.1f} min", flush=True)


def _clean(text: str) -> str:
  return " ".join(text.replace("\t", " ").split())


if __name__ == "__main__":
  app.run(main)
