"""Blocks of a man page (roff source with the man macros), in reading order, for align.align_blocks.

Paragraphs start at .SH/.SS/.PP/.LP/.P/.IP/.TP/.HP/.RS/.RE/.sp; a .TP (or .IP) tag becomes its own block, whose
signature holds the options it names ("tag:-a --all"), the same in a page and its translation. No-fill and example
regions (.nf/.fi, .EX/.EE) become verbatim blocks; tables (.TS/.TE), macro definitions and comments are skipped;
font macros (.B, .BR, ...) and the usual escapes (\\fB, \\-, \\(em, \\*(lq, ...) are turned into plain text.
"""

from __future__ import annotations

import gzip
import re
import shlex

from jaxspec.data.corpus.align import Block
from jaxspec.data.corpus.text import squash

_CHARS = {"em": "—", "en": "–", "lq": "“", "rq": "”", "Bq": "„", "bq": "‚", "Fo": "«", "Fc": "»", "fo": "‹",
          "fc": "›", "oq": "‘", "cq": "’", "aq": "'", "dq": '"', "bu": "•", "co": "©", "rg": "®", "tm": "™",
          "hy": "-", "mi": "-", "pl": "+", "mu": "×", "de": "°", "ha": "^", "ti": "~", "rs": "\\", "ss": "ß",
          ":a": "ä", ":o": "ö", ":u": "ü", ":A": "Ä", ":O": "Ö", ":U": "Ü", "->": "→", "<-": "←", "R": "®"}
_ESCAPE = re.compile(r"\\(?:f(?:\(..|\[[^\]]*\]|.)|s[-+]?(?:\d+|\(..|\[[^\]]*\])|\*?(?:\((..)|\[([^\]]*)\])|"
                     r"[*n](.)|[hvwNXmoZ]'[^']*'|[mM](?:\(..|\[[^\]]*\]|.)|(.))")
_SIMPLE = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "&": "", "%": "", "c": "", ":": "",
           "|": "", "^": "", ",": "", "/": "", ".": ".", "'": "'", "`": "`", "t": " ", "d": "", "u": "", "p": ""}
_BREAK = frozenset("SH SS PP LP P IP TP HP RS RE sp TQ SY YS OP".split())
_SKIP_REGION = {"TS": "TE", "de": "..", "de1": "..", "am": "..", "ig": "..", "EQ": "EN"}
_VERBATIM_REGION = {"nf": "fi", "EX": "EE"}
_JOINED_FONTS = frozenset("BR BI IB IR RB RI".split())
_SPACED_FONTS = frozenset("B I SM SB".split())
_OPTION = re.compile(r"(?<![\w-])--?[A-Za-z0-9][\w-]*")


def unescape(line: str) -> str:
  """Plain text of one roff text line: fonts dropped, named characters and simple escapes replaced."""
  def repl(m: re.Match) -> str:
    named = m.group(1) or m.group(2)
    if named is not None:
      return _CHARS.get(named, "")
    if m.group(4) is not None:
      return _SIMPLE.get(m.group(4), "")
    return ""
  return _ESCAPE.sub(repl, line)


def _arguments(rest: str) -> list[str]:
  try:
    return shlex.split(rest.replace("\\", "\\\\"), posix=True)
  except ValueError:
    return rest.split()


class _Reader:
  """Turns roff lines into blocks."""

  def __init__(self):
    self.blocks: list[Block] = []
    self.lines: list[str] = []
    self.kind = "PP"
    self.tag_next = False

  def flush(self, verbatim: bool = False) -> None:
    text = squash(" ".join(self.lines))
    if text:
      if verbatim:
        self.blocks.append(Block(f"pre:{text}", text, verbatim=True))
      elif self.kind == "tag":
        self.blocks.append(Block("tag:" + " ".join(_OPTION.findall(text)), text))
      else:
        self.blocks.append(Block(self.kind, text))
    self.lines = []

  def text(self, line: str) -> None:
    self.lines.append(line)
    if self.tag_next:  # the line after .TP is the tag; the paragraph body follows
      self.kind, self.tag_next = "tag", False
      self.flush()
      self.kind = "TP"

  def read(self, source: str) -> list[Block]:
    end_of_region, verbatim = None, False
    for raw in source.splitlines():
      if end_of_region is not None:
        if raw.startswith("." + end_of_region) or (end_of_region == ".." and raw.strip() == ".."):
          if verbatim:
            self.flush(verbatim=True)
          end_of_region, verbatim = None, False
        elif verbatim and not raw.startswith((".", "'")):
          self.lines.append(unescape(raw))
        continue
      if raw.startswith((".\\\"", "'\\\"", "\\\"")):
        continue
      if not raw.startswith((".", "'")):
        self.text(unescape(raw)) if raw.strip() else self.flush()
        continue
      macro, _, rest = raw[1:].strip().partition(" ")
      if macro in _SKIP_REGION or macro in _VERBATIM_REGION:
        self.flush()
        end_of_region = _SKIP_REGION.get(macro) or _VERBATIM_REGION[macro]
        verbatim = macro in _VERBATIM_REGION
      elif macro in _BREAK:
        self.flush()
        self.kind = {"LP": "PP", "P": "PP", "TQ": "TP"}.get(macro, macro)
        self.tag_next = macro in ("TP", "TQ")
        if macro in ("SH", "SS") and rest.strip():
          self.lines.append(unescape(" ".join(_arguments(rest))))
          self.flush()
        if macro == "IP" and rest.strip():
          self.kind = "tag"
          self.lines.append(unescape(_arguments(rest)[0] if _arguments(rest) else ""))
          self.flush()
          self.kind = "IP"
      elif macro in _JOINED_FONTS:
        self.text(unescape("".join(_arguments(rest))))
      elif macro in _SPACED_FONTS and rest.strip():
        self.text(unescape(" ".join(_arguments(rest))))
    self.flush()
    return self.blocks


def read_blocks(path: str) -> list[Block]:
  """Blocks of one man page (gzipped when the name ends in .gz); [] for a `.so` redirect."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    data = f.read()
  try:
    source = data.decode("utf-8")
  except UnicodeDecodeError:
    source = data.decode("latin-1")
  if source.lstrip().startswith(".so "):
    return []
  return _Reader().read(source)
