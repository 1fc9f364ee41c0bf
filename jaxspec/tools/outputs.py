"""What the scripts write: resumable line files, atomic files, progress bars and aligned markdown tables.

A `LineWriter` file holds one line per input item, in order (after an optional header line); a rerun resumes
after the last COMPLETE line: a partial last line (a full disk, a kill mid-write) is dropped and redone, and a file
with more lines than there are inputs is refused. Every batch of lines is flushed and fsynced before the next
starts. Lines are escaped (backslash, newline, carriage return as \\, \n, \r), so a multi-line output stays on
its line; `unescape_line` reverses it. `.gz` files are written as one gzip member per batch; a `.gz` file that is
not gzip data is refused (`OutputError`), never truncated. Which files the launch scripts may resume at all, and
with which settings: `jaxspec.cli.resume`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import sys
import zlib
from typing import Any, Sequence

from tqdm import tqdm

from jaxspec.errors import OutputError

GZIP_MAGIC = b"\x1f\x8b"


def escape_line(text: str) -> str:
  return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def unescape_line(line: str) -> str:
  out, i = [], 0
  while i < len(line):
    if line[i] == "\\" and i + 1 < len(line):
      out.append({"n": "\n", "r": "\r", "\\": "\\"}.get(line[i + 1], line[i:i + 2]))
      i += 2
    else:
      out.append(line[i])
      i += 1
  return "".join(out)


def _existing(path: str) -> tuple[bytes, bool]:
  """The file's (decompressed) bytes as far as they are readable, and whether all of it was.

  A .gz file is read member by member, so a member cut short by a kill loses only its own unreadable tail.
  """
  with open(path, "rb") as f:
    raw = f.read()
  if not path.endswith(".gz"):
    return raw, True
  if not GZIP_MAGIC.startswith(raw[:2]):  # b'' and a first byte cut after 0x1f pass
    raise OutputError(f"{path}: named .gz but not gzip data: not an output of this script, left untouched (remove "
                      "it or choose another output).")
  out, pos = [], 0
  while pos < len(raw):
    member = zlib.decompressobj(wbits=31)
    try:
      out.append(member.decompress(raw[pos:]))
    except zlib.error:
      return b"".join(out), False
    if not member.eof:
      return b"".join(out), False
    pos = len(raw) - len(member.unused_data)
  return b"".join(out), True


def atomic_write(path: str, data: bytes | str) -> None:
  """Writes `data` to path so that readers see the old file or the whole new one, never a part."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data.encode("utf-8") if isinstance(data, str) else data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def atomic_write_json(path: str, obj: Any, indent: int | None = None) -> None:
  atomic_write(path, json.dumps(obj, indent=indent))


class LineWriter:
  """Appends one line per item to `path`; `done` items are already there (see the module docstring).

  escape=False writes lines as given (the caller guarantees they hold no newline, e.g. cleaned TSV rows).
  """

  def __init__(self, path: str, total: int, header: str | None = None, escape: bool = True):
    self.path, self.gz, self.escape = path, path.endswith(".gz"), escape
    if os.path.isdir(path):
      raise OutputError(f"{path}: is a directory, expected an output file.")
    data, intact = _existing(path) if os.path.exists(path) else (b"", True)
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) < len(data) or not intact:
      logging.warning("%s ends in an incomplete line (%d bytes%s): dropped, that line is redone.", path,
                      len(data) - len(complete), "" if intact else ", in a cut gzip member")
      if self.gz:
        atomic_write(path, gzip.compress(complete))
      else:
        os.truncate(path, len(complete))
    lines = complete.count(b"\n")
    if header is not None and lines:
      first = complete[:complete.find(b"\n")].decode("utf-8", "replace")
      if first != header:
        raise OutputError(f"{path}: its first line is {first[:60]!r}, not the header {header!r}: not an output of "
                         "this script (remove it or choose another output).")
    self.done = max(lines - (header is not None), 0)
    if self.done > total:
      raise OutputError(f"{path} already has {self.done} lines, more than the {total} inputs: it is not the output of "
                       "this input (remove it or choose another output).")
    if header is not None and not lines:
      self._append([header], escape=False)

  def _append(self, lines: Sequence[str], escape: bool = True) -> None:
    data = "".join((escape_line(t) if escape else t) + "\n" for t in lines).encode("utf-8")
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    with open(self.path, "ab") as f:
      f.write(gzip.compress(data) if self.gz else data)
      f.flush()
      os.fsync(f.fileno())

  def write(self, lines: Sequence[str]) -> None:
    """Appends one line per item, flushed and fsynced."""
    self._append(lines, self.escape)
    self.done += len(lines)


def progress(total: int, desc: str, unit: str = "line", initial: int = 0) -> tqdm:
  """A tqdm progress bar on stderr with rate and ETA (`initial` items already done, e.g. when resuming)."""
  return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
              mininterval=0.5, smoothing=0.1)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  """A markdown table with every column padded to its widest cell (so it reads aligned as plain text too)."""
  cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
  width = [max(len(r[i]) if i < len(r) else 0 for r in cells) for i in range(len(header))]
  line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |"
  return [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in width) + "|"] + [line(r) for r in cells[1:]]
