"""Aligns an English document with its German translation: blocks by structure, then sentences inside blocks.

A document is a list of `Block`s in reading order (paragraphs, list items, headings, table cells, code blocks),
each with a structural signature (tag and class, an element id, or the text of a code block, which is the same in
both languages). Blocks are paired where the two signature sequences match (difflib's matching runs, so inserted or
missing blocks on either side do not shift the rest); a pair is dropped when its inline code/literals differ or its
lengths disagree. Inside a block pair, sentences are paired one to one when both sides split into as many
sentences, else by a small length-based dynamic programme (1-1, 1-2 and 2-1 links, as Gale and Church).
"""

from __future__ import annotations

import dataclasses
import difflib
import math

from jaxspec.data.corpus.text import split_sentences


@dataclasses.dataclass(frozen=True)
class Block:
  tag: str  # structural signature: element and class ("p.para", "li", "SH"), or "pre:<text>" for code
  text: str  # whitespace-collapsed text
  ident: str = ""  # element id, when the format carries ids shared by the translations
  anchors: frozenset[str] = frozenset()  # inline code / literal / command texts, kept verbatim by translators
  verbatim: bool = False  # code or example output: used to align, never emitted as a pair


def _signatures(blocks: list[Block], use_ids: bool) -> list[str]:
  return [f"{b.tag}#{b.ident}" if use_ids and b.ident else b.tag for b in blocks]


def align_blocks(en: list[Block], de: list[Block], min_ratio: float = 0.4,
                 max_ratio: float = 2.5) -> list[tuple[str, str]]:
  """(English text, German text) of the blocks whose places in both structures match.

  Element ids take part in the match when most ids of the English document also occur in the German one (ids
  generated from translated titles do not).
  """
  en_ids, de_ids = {b.ident for b in en if b.ident}, {b.ident for b in de if b.ident}
  use_ids = bool(en_ids) and len(en_ids & de_ids) >= 0.5 * len(en_ids)
  matcher = difflib.SequenceMatcher(None, _signatures(en, use_ids), _signatures(de, use_ids), autojunk=False)
  pairs = []
  for a, b, size in matcher.get_matching_blocks():
    for x, y in zip(en[a:a + size], de[b:b + size]):
      if x.verbatim or y.verbatim or not x.text or not y.text:
        continue
      if x.anchors != y.anchors or not min_ratio <= len(y.text) / len(x.text) <= max_ratio:
        continue
      pairs.append((x.text, y.text))
  return pairs


def _cost(en: list[str], de: list[str]) -> float:
  """Mismatch of one link: |log| of the German/English length ratio against the usual 1.15, merges penalised."""
  ratio = (sum(map(len, de)) + 1) / (1.15 * (sum(map(len, en)) + 1))
  return abs(math.log(ratio)) + 0.3 * (len(en) + len(de) - 2)


def align_sentences(en_text: str, de_text: str, max_cost: float = 0.5) -> list[tuple[str, str]]:
  """Sentence pairs of one aligned block; links merging two sentences give one pair of joined sentences.

  Links whose length ratio is far from usual (cost above max_cost) are left out.
  """
  en, de = split_sentences(en_text), split_sentences(de_text)
  if len(en) == len(de):
    return list(zip(en, de))
  n, m = len(en), len(de)
  best = {(0, 0): (0.0, None)}  # (i, j) -> (cost of aligning en[:i] with de[:j], previous cell)
  for i in range(n + 1):
    for j in range(m + 1):
      if (i, j) not in best:
        continue
      for di, dj in ((1, 1), (1, 2), (2, 1)):
        if i + di <= n and j + dj <= m:
          cost = best[(i, j)][0] + _cost(en[i:i + di], de[j:j + dj])
          if (i + di, j + dj) not in best or cost < best[(i + di, j + dj)][0]:
            best[(i + di, j + dj)] = (cost, (i, j))
  if (n, m) not in best:
    return []
  links, cell = [], (n, m)
  while best[cell][1] is not None:
    prev = best[cell][1]
    links.append((" ".join(en[prev[0]:cell[0]]), " ".join(de[prev[1]:cell[1]]), _cost(en[prev[0]:cell[0]],
                                                                                       de[prev[1]:cell[1]])))
    cell = prev
  return [(e, d) for e, d, c in reversed(links) if c <= max_cost]
