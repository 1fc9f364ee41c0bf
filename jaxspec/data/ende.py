"""English-German sentence pairs: reading TSV files and batching them by length.

TSV format (as in ../shared/data/ende and as `launch/build_corpus.py` writes): a header `en<TAB>de<TAB>source`,
then one pair per line; `.gz` files are read transparently.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
from typing import Iterator

import numpy as np


@dataclasses.dataclass(frozen=True)
class Pair:
  en: str
  de: str
  source: str = ""

  @property
  def is_natural(self) -> bool:
    """A natural sentence (the Ding dictionary's examples), not a software string."""
    return "ding" in self.source


def read_pairs(path: str, limit: int | None = None) -> list[Pair]:
  """Reads an EN-DE TSV (optionally gzipped). Rows with an empty side are skipped."""
  opener = gzip.open if path.endswith(".gz") else open
  pairs = []
  with opener(path, "rt", encoding="utf-8", newline="") as f:
    reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if header is None or header[:2] != ["en", "de"]:
      raise ValueError(f"{path}: expected a header 'en<TAB>de[<TAB>source]', got {header}.")
    for row in reader:
      if len(row) < 2 or not row[0].strip() or not row[1].strip():
        continue
      pairs.append(Pair(row[0], row[1], row[2] if len(row) > 2 else ""))
      if limit is not None and len(pairs) >= limit:
        break
  return pairs


def write_pairs(path: str, pairs: list[Pair]) -> None:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "wt", encoding="utf-8", newline="") as f:
    f.write("en\tde\tsource\n")
    for p in pairs:
      f.write("\t".join(s.replace("\t", " ").replace("\n", " ") for s in (p.en, p.de, p.source)) + "\n")


def length_buckets(max_len: int, smallest: int = 8) -> list[int]:
  """Padded lengths used for batching: 8, 16, 24, 32, 48, 64, ... up to max_len."""
  out, n = [], smallest
  while n < max_len:
    out.append(n)
    n = n + 8 if n < 32 else n + 16
  return out + [max_len]


def _bucket(n: int, buckets: list[int]) -> int:
  for b in buckets:
    if n <= b:
      return b
  return buckets[-1]


def bucketed_batches(sources: list[list[int]], targets: list[list[int]], tokens_per_batch: int, max_len: int,
                     rng: np.random.RandomState, pad_id: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """One epoch of (inputs [B, S], labels [B, T]) batches, grouped by padded length, in random order.

  Each pair goes to the bucket of max(len(source), len(target)); a batch holds about tokens_per_batch padded
  tokens per side, so short sentences come in large batches and padding stays small. Sequences longer than
  max_len are truncated (their last token kept, so EOS survives).
  """
  buckets = length_buckets(max_len)
  groups: dict[int, list[int]] = {}
  for i, (s, t) in enumerate(zip(sources, targets)):
    groups.setdefault(_bucket(max(len(s), len(t)), buckets), []).append(i)
  batches = []
  for length, idx in groups.items():
    idx = list(rng.permutation(idx))
    size = max(1, tokens_per_batch // length)
    batches += [(length, idx[k:k + size]) for k in range(0, len(idx), size)]
  for j in rng.permutation(len(batches)):
    length, idx = batches[j]
    rows = max(1, tokens_per_batch // length)  # A short last batch is padded with all-pad rows (zero loss),
    yield (_pad([sources[i] for i in idx], length, pad_id, rows),  # so each bucket has one shape and
           _pad([targets[i] for i in idx], length, pad_id, rows))  # compiles once.


def _pad(rows: list[list[int]], length: int, pad_id: int, num_rows: int) -> np.ndarray:
  out = np.full((num_rows, length), pad_id, np.int32)
  for i, r in enumerate(rows):
    r = r if len(r) <= length else r[:length - 1] + r[-1:]
    out[i, :len(r)] = r
  return out
