"""Builds the EN-DE corpus: reads every source, filters, removes repeated English, splits, writes, counts.

Two modes. Fresh: catalogs + Ding are split into dev.tsv/test.tsv/train as before, documentation pairs add
dev_doc.tsv/test_doc.tsv and the rest of train. On a base corpus (`base_dir` with train.tsv.gz, dev.tsv,
test.tsv, as ../shared/data/ende): its dev/test stay as they are, its train is kept whole, and new pairs are added
to train, never one whose English (text.english_key) is in the base corpus or the held-out documentation pairs.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os

import numpy as np
from absl import logging

from jaxspec.data.corpus import catalogs, sources
from jaxspec.data.corpus.text import ProseFilter, StringFilter, english_key
from jaxspec.data.ende import Pair, read_pairs, write_pairs
from jaxspec.errors import CorpusError


@dataclasses.dataclass
class Counts:
  """Pairs of one source at each stage: read (aligned or in the catalog), filtered, new (not a repeat)."""
  read: int = 0
  filtered: int = 0
  new: int = 0
  dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def _catalog_label(root: str, path: str) -> str:
  """Counts group catalogs by the directory under the root ("mo:inkscape" for <root>/inkscape/usr/share/...)."""
  first = os.path.relpath(path, root).split(os.sep)[0]
  return f"mo:{first}" if first != "de" else f"mo:{root}"


def read_catalogs(roots: list[str], ding: str, counts: dict[str, Counts]) -> tuple[list[Pair], list[str]]:
  """Filtered catalog pairs (text.StringFilter) of every .mo under the roots, then the Ding sentences; and the
  count label of each pair."""
  pairs, labels, strings = [], [], StringFilter()
  for root in roots:
    for path in catalogs.catalog_files(root):
      label = _catalog_label(root, path)
      c = counts.setdefault(label, Counts())
      for p in catalogs.catalog_pairs(path):
        c.read += 1
        reason = strings.reason(p.en, p.de)
        if reason is None:
          pairs.append(p)
          labels.append(label)
        else:
          c.dropped[reason] += 1
  ding_pairs = catalogs.ding_pairs(ding)
  if ding_pairs:
    counts.setdefault("ding", Counts()).read = len(ding_pairs)
  return pairs + ding_pairs, labels + ["ding"] * len(ding_pairs)


def read_documents(roots: list[str], names: list[str] | None, counts: dict[str, Counts]) -> list[Pair]:
  """Filtered sentence pairs of every documentation source (sources.SOURCES, or those named) under the roots."""
  pairs, prose = [], ProseFilter()
  for source in sources.SOURCES:
    if names is not None and source.name not in names:
      continue
    c = counts.setdefault(f"doc:{source.name}", Counts())
    files = sources.document_files(source, roots)
    logging.info("%s: %d document pairs", source.name, len(files))
    for en_path, de_path in files:
      kept, aligned = sources.document_pairs(source, en_path, de_path, prose, c.dropped)
      c.read += aligned
      pairs += kept
  return pairs


def unique(pairs: list[Pair], labels: list[str], taken: set[str], counts: dict[str, Counts]) -> list[Pair]:
  """Pairs whose English key is not in `taken` nor earlier in the list (first kept); adds their keys to taken.

  counts[labels[i]] counts pair i.
  """
  out = []
  for p, label in zip(pairs, labels):
    c = counts.setdefault(label, Counts())
    c.filtered += 1
    key = english_key(p.en)
    if key and key not in taken:
      taken.add(key)
      out.append(p)
      c.new += 1
  return out


def held_out(pairs: list[Pair], n: int, rng: np.random.RandomState, min_words: int) -> tuple[list, list, list]:
  """Two random sets of n pairs of min_words+ English words (dev, test) and the rest."""
  eligible = [i for i, p in enumerate(pairs) if len(p.en.split()) >= min_words]
  if len(eligible) < 3 * n:
    raise CorpusError(f"only {len(eligible)} pairs of {min_words}+ words to hold out 2 x {n}: lower the held-out "
                      "size or add sources.")
  chosen = [eligible[i] for i in rng.permutation(len(eligible))[:2 * n]]
  held = set(chosen)
  return [pairs[i] for i in chosen[:n]], [pairs[i] for i in chosen[n:]], [p for i, p in enumerate(pairs)
                                                                          if i not in held]


def build(output_dir: str, catalog_roots: list[str], ding: str, doc_roots: list[str], doc_names: list[str] | None,
          base_dir: str | None, dev_size: int, doc_dev_size: int, seed: int) -> dict:
  """Writes train.tsv.gz, dev.tsv, test.tsv (and dev_doc.tsv, test_doc.tsv with documentation) and counts.json
  into output_dir; returns the counts."""
  rng = np.random.RandomState(seed)
  counts: dict[str, Counts] = {}
  general, labels = read_catalogs(catalog_roots, ding, counts)
  documents = read_documents(doc_roots, doc_names, counts) if doc_roots else []
  splits: dict[str, list[Pair]] = {}
  if base_dir:
    for name in ("train.tsv.gz", "dev.tsv", "test.tsv"):
      if not os.path.exists(os.path.join(base_dir, name)):
        raise CorpusError(f"--base_dir {base_dir} has no {name}.")
    base = {name: read_pairs(os.path.join(base_dir, name)) for name in ("train.tsv.gz", "dev.tsv", "test.tsv")}
    taken = {english_key(p.en) for pairs in base.values() for p in pairs}
    splits["dev.tsv"], splits["test.tsv"] = base["dev.tsv"], base["test.tsv"]
    train = base["train.tsv.gz"] + unique(general, labels, taken, counts)
  else:
    taken = set()
    general = unique(general, labels, taken, counts)
    order = rng.permutation(len(general))
    if len(general) < 3 * dev_size:
      raise CorpusError(f"only {len(general)} distinct catalog/dictionary pairs found: lower --dev_size or add "
                        "--locale_roots.")
    splits["dev.tsv"] = [general[i] for i in order[:dev_size]]
    splits["test.tsv"] = [general[i] for i in order[dev_size:2 * dev_size]]
    train = [general[i] for i in order[2 * dev_size:]]
  if documents:
    documents = unique(documents, [p.source for p in documents], taken, counts)
    splits["dev_doc.tsv"], splits["test_doc.tsv"], rest = held_out(documents, doc_dev_size, rng, min_words=5)
    train += rest
  splits["train.tsv.gz"] = train
  os.makedirs(output_dir, exist_ok=True)
  for name, pairs in splits.items():
    write_pairs(os.path.join(output_dir, name), pairs)
  report = {"sources": {k: {"read": c.read, "filtered": c.filtered, "new": c.new, "dropped": dict(c.dropped)}
                        for k, c in sorted(counts.items())},
            "splits": {name: len(pairs) for name, pairs in splits.items()},
            "train_by_domain": dict(collections.Counter(_domain(p) for p in train))}
  with open(os.path.join(output_dir, "counts.json"), "w") as f:
    json.dump(report, f, indent=1)
  return report


def _domain(p: Pair) -> str:
  return "documentation" if p.source.startswith("doc:") else "dictionary" if "ding" in p.source else "software"
