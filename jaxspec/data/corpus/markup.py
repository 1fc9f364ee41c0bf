"""Blocks of an HTML, XHTML or XML (DocBook, Mallard) document, in reading order, for align.align_blocks.

Text inside paragraph-like elements (p, li, dt, dd, headings, table cells, Mallard title/desc, DocBook para/entry)
forms one block per element; nested paragraph-like elements make their own blocks. Code blocks (pre, screen,
programlisting, a Mallard <code> outside a paragraph) become verbatim blocks whose signature is their text. Inline
code (code, tt, kbd, literal, command, filename, cmd, sys, file, var) is kept in the text and also recorded as
the block's anchors; Mallard key and GUI sequences are joined ("Ctrl+H", "Edit ▸ Copy"). Scripts, styles, the HTML
head and Mallard credits are skipped. Stdlib only (html.parser).
"""

from __future__ import annotations

import bz2
import gzip
import html.parser

from jaxspec.data.corpus.align import Block
from jaxspec.data.corpus.text import squash

_TEXT = frozenset("""p li dt dd h1 h2 h3 h4 h5 h6 td th caption figcaption title desc para simpara entry term
  blockquote div section body subtitle""".split())
_BOUNDARY = frozenset("table tr ul ol dl tbody thead hr item terms tree steps list note".split())
_VERBATIM = frozenset("pre screen programlisting synopsis example".split())
_INLINE_CODE = frozenset("code tt kbd samp literal command filename cmd sys file var option userinput".split())
_SKIP = frozenset("script style head credit mal:credit revision mal:name mal:email mal:years".split())
_CLOSES_P = _TEXT | _BOUNDARY | _VERBATIM
_SEQUENCES = {"keyseq": ("key", "+"), "guiseq": ("gui", " ▸ ")}  # Mallard: <keyseq><key>Ctrl</key><key>H</key>


class _Extractor(html.parser.HTMLParser):
  """Collects blocks; tolerant of unclosed <p> and stray end tags (old HTML)."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.blocks: list[Block] = []
    self.stack: list[tuple[str, str, str]] = []  # open text / verbatim elements: (tag, signature, id)
    self.text: list[str] = []
    self.anchors: set[str] = set()
    self.code: list[str] | None = None  # text of the inline code element being read
    self.skip = 0
    self.sequence: list = []  # [element, joiner, items so far] inside a Mallard keyseq/guiseq

  def _flush(self) -> None:
    text = squash("".join(self.text))
    if text and self.stack:
      tag, signature, ident = self.stack[-1]
      if tag in _VERBATIM or tag == "code":
        self.blocks.append(Block(f"pre:{text}", text, verbatim=True))
      else:
        self.blocks.append(Block(signature, text, ident, frozenset(self.anchors)))
    self.text, self.anchors = [], set()

  def handle_starttag(self, tag, attrs):
    if tag in _SKIP:
      self.skip += 1
      return
    if tag == "br":
      self.text.append(" ")
      return
    if tag in _SEQUENCES:
      self.sequence = [*_SEQUENCES[tag], 0]
    elif self.sequence and tag == self.sequence[0]:
      self.text.append(self.sequence[1] if self.sequence[2] else "")
      self.sequence[2] += 1
    attrs = dict(attrs)
    in_text = any(t in _TEXT for t, _, _ in self.stack)
    if tag in _INLINE_CODE and (in_text or tag != "code"):
      self.code = []
      return
    if tag not in _TEXT and tag not in _BOUNDARY and tag not in _VERBATIM and tag != "code":
      return
    self._flush()
    if self.stack and self.stack[-1][0] == "p" and tag in _CLOSES_P:
      self.stack.pop()  # an unclosed <p> ends where the next block starts
    if tag not in _BOUNDARY:
      css = (attrs.get("class") or "").split()
      self.stack.append((tag, f"{tag}.{css[0]}" if css else tag, attrs.get("id") or ""))

  def handle_endtag(self, tag):
    if tag in _SEQUENCES:
      self.sequence = []
    if tag in _SKIP:
      self.skip = max(0, self.skip - 1)
      return
    if tag in _INLINE_CODE and self.code is not None:
      code = squash("".join(self.code))
      if code:
        self.anchors.add(code)
      self.code = None
      return
    if tag in _BOUNDARY:
      self._flush()
      return
    if any(t == tag for t, _, _ in self.stack):
      self._flush()
      while self.stack and self.stack.pop()[0] != tag:
        pass

  def handle_data(self, data):
    if self.skip:
      return
    self.text.append(data)
    if self.code is not None:
      self.code.append(data)

  def close(self):
    super().close()
    self._flush()


def read_blocks(path: str) -> list[Block]:
  """Blocks of one HTML/XML file (compressed when the name ends in .gz or .bz2); undecodable bytes replaced."""
  opener = gzip.open if path.endswith(".gz") else bz2.open if path.endswith(".bz2") else open
  with opener(path, "rb") as f:
    data = f.read().decode("utf-8", errors="replace")
  parser = _Extractor()
  parser.feed(data)
  parser.close()
  return parser.blocks
