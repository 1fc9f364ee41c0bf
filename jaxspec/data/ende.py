"""English-German sentence pairs: where the corpus lives, reading TSV files and batching them by length.

TSV format (as `launch/build_corpus.py` writes it): a header `en<TAB>de<TAB>source`, then one pair per line;
`.gz` files are read transparently. The corpus directory holds train.tsv.gz, dev.tsv and test.tsv (natural
sentences and software strings) and, in the bigger corpus (docs/corpus.md), dev_doc.tsv and test_doc.tsv
(documentation); scripts take it as --data_dir (or --config.data_dir), defaulting to `default_data_dir()`.

Domains (`Pair.domain`), told apart by the `source` column: "natural" (the Ding dictionary's example sentences,
source "ding" or "... (ding)"), "documentation" (sources "doc:<name>"), "software" (gettext catalog strings:
everything else). A distilled pair (launch/distill_corpus.py) keeps its original source after "distilled:".
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from typing import Iterator

import numpy as np

from jaxspec.tools.inputs import InputError, read_tsv

SPLITS = {"train": "train.tsv.gz", "dev": "dev.tsv", "test": "test.tsv", "dev_doc": "dev_doc.tsv",
          "test_doc": "test_doc.tsv"}
DOMAINS = ("natural", "documentation", "software")
DISTILLED = "distilled:"  # Source prefix of a pair whose German is a model's translation.
DATA_ENV = "JAXSPEC_ENDE_DATA"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_data_dir() -> str:
  """$JAXSPEC_ENDE_DATA if set, else the project's shared corpus beside the checkout (REPO/../shared/data/ende)."""
  return os.environ.get(DATA_ENV) or os.path.normpath(os.path.join(_REPO, "..", "shared", "data", "ende"))


def split_path(split_or_path: str, data_dir: str = "", flag: str = "--data_dir (or --config.data_dir)") -> str:
  """A split name ('train', 'dev', 'test') as its file in data_dir (default: `default_data_dir()`), or a path.

  Raises InputError naming the file and how to provide one when it does not exist (`flag`: the caller's flag that
  names data_dir).
  """
  if split_or_path not in SPLITS:
    if not os.path.exists(split_or_path):
      raise InputError(f"{split_or_path}: no such file (expected an EN-DE TSV, or one of {list(SPLITS)}).")
    return split_or_path
  data_dir = data_dir or default_data_dir()
  path = os.path.join(data_dir, SPLITS[split_or_path])
  if not os.path.exists(path):
    raise InputError(f"EN-DE {split_or_path} split not found: {path}. Pass {flag} with a directory holding "
                     f"{SPLITS[split_or_path]}" + (f", or set ${DATA_ENV}" if flag.startswith("--data_dir") else "")
                     + "; launch/build_corpus.py --output_dir=DIR builds one.")
  return path


@dataclasses.dataclass(frozen=True)
class Pair:
  en: str
  de: str
  source: str = ""

  @property
  def domain(self) -> str:
    """The pair's domain: natural (Ding example sentences), documentation (doc:<name>) or software."""
    source = self.source.removeprefix(DISTILLED)
    if source == "ding" or "(ding)" in source:
      return "natural"
    return "documentation" if source.startswith("doc:") else "software"

  @property
  def is_natural(self) -> bool:
    """A natural sentence of the Ding dictionary (documentation prose is natural too, but its own domain)."""
    return self.domain == "natural"


def read_pairs(path: str, limit: int | None = None) -> list[Pair]:
  """Reads an EN-DE TSV (optionally gzipped) for training and evaluation: rows with an empty side are skipped."""
  header, rows = read_tsv(path)
  if header[:2] != ["en", "de"]:
    raise InputError(f"{path}: expected a header 'en<TAB>de[<TAB>source]', got {header[:3]}.")
  pairs = [Pair(r["en"], r["de"], r.get("source", "")) for r in rows if r["en"].strip() and r["de"].strip()]
  return pairs[:limit]


def read_splits(splits: str, data_dir: str = "") -> list[Pair]:
  """The pairs of comma-separated split names or paths, in order (e.g. "test,test_doc")."""
  return [p for name in splits.split(",") if name.strip() for p in read_pairs(split_path(name.strip(), data_dir))]


def evenly_spaced(items: list, limit: int) -> list:
  """`limit` items spread evenly over the list (all of them when limit is 0 or larger than the list)."""
  if not limit or limit >= len(items):
    return items
  return [items[i] for i in np.linspace(0, len(items) - 1, limit).astype(int)]


def by_domain(pairs: list[Pair]) -> dict[str, list[Pair]]:
  """The pairs of each domain (DOMAINS order; domains without pairs left out), in their order."""
  out = {d: [p for p in pairs if p.domain == d] for d in DOMAINS}
  return {d: ps for d, ps in out.items() if ps}


def distillation_sources(pairs: list[Pair], max_pairs: int, domains: tuple[str, ...] = DOMAINS) -> list[Pair]:
  """Pairs whose English a target translates for sequence-level distillation: one per English text, the given
  domains in that order of priority (natural sentences first by default: the alpha bar is measured on them),
  at most max_pairs."""
  unknown = set(domains) - set(DOMAINS)
  if unknown:
    raise InputError(f"unknown domain(s) {sorted(unknown)}: expected some of {', '.join(DOMAINS)}.")
  seen, out = set(), []
  for domain in domains:
    for p in pairs:
      if p.domain == domain and p.en not in seen and len(out) < max_pairs:
        seen.add(p.en)
        out.append(p)
  return out


def write_pairs(path: str, pairs: list[Pair]) -> None:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "wt", encoding="utf-8", newline="") as f:
    f.write("en\tde\tsource\n")
    for p in pairs:
      f.write("\t".join(s.replace("\t", " ").replace("\n", " ") for s in (p.en, p.de, p.source)) + "\n")


def length_buckets(max_len: int, smallest: int = 8, spec: str = "") -> list[int]:
  """Padded lengths used for batching: 8, 16, 24, 32, 48, 64, ... up to max_len, or those of `spec`
  ("16,32,64": each one compiles a train step, so fewer buckets compile less and pad more), max_len last."""
  if spec:
    return sorted({int(b) for b in spec.split(",") if int(b) < max_len} | {max_len})
  out, n = [], smallest
  while n < max_len:
    out.append(n)
    n = n + 8 if n < 32 else n + 16
  return out + [max_len]


def bucket_of(n: int, buckets: list[int]) -> int:
  """The padded length of a pair whose longer side has n tokens: the first bucket >= n (else the last)."""
  for b in buckets:
    if n <= b:
      return b
  return buckets[-1]


_bucket = bucket_of


def bucketed_batches(sources: list[list[int]], targets: list[list[int]], tokens_per_batch: int, max_len: int,
                     rng: np.random.RandomState, pad_id: int = 0,
                     buckets: list[int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """One epoch of (inputs [B, S], labels [B, T]) batches, grouped by padded length, in random order.

  Each pair goes to the bucket of max(len(source), len(target)); a batch holds about tokens_per_batch padded
  tokens per side, so short sentences come in large batches and padding stays small. Sequences longer than
  max_len are truncated (their last token kept, so EOS survives). buckets: the padded lengths (default
  `length_buckets(max_len)`).
  """
  buckets = buckets or length_buckets(max_len)
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
    yield (pad_rows([sources[i] for i in idx], length, pad_id, rows),  # so each bucket has one shape and
           pad_rows([targets[i] for i in idx], length, pad_id, rows))  # compiles once.


def pad_rows(rows: list[list[int]], length: int, pad_id: int, num_rows: int) -> np.ndarray:
  """[num_rows, length] int32: the rows padded (rows past len(rows) all padding), longer ones cut keeping their
  last token (EOS)."""
  out = np.full((num_rows, length), pad_id, np.int32)
  for i, r in enumerate(rows):
    r = r if len(r) <= length else r[:length - 1] + r[-1:]
    out[i, :len(r)] = r
  return out
