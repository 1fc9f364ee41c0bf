"""Reading inputs for the launch scripts and notebooks: text files, TSV files (optionally gzipped) and stdin.

One rule for every reader: EVERY line of a text file, and every row after a TSV's header, is one item, in order;
an empty line or a row without the wanted column is an empty item (scripts that write one output per input give
it an empty output; scripts that measure skip it). A final newline does not start another item. A TSV must have a
header row naming its columns ('en' for the English side); its other columns are ignored. Files are UTF-8 (a
leading BOM is dropped); a line that is not valid UTF-8 is an `InputError` naming the file and the line.
"""

from __future__ import annotations

import gzip
import logging
import os
import sys
import zlib
from jaxspec.errors import InputError

STDIN = "-"


def _read_bytes(spec: str) -> bytes:
  if spec == STDIN:
    if sys.stdin.isatty():  # Not a silent wait on a terminal.
      print("reading inputs from stdin, one per line; end with Ctrl-D (or pass --input=FILE)", file=sys.stderr,
            flush=True)
    return sys.stdin.buffer.read()
  if not os.path.exists(spec):
    raise InputError(f"{spec}: no such file.")
  if os.path.isdir(spec):
    raise InputError(f"{spec}: is a directory, expected a text or TSV file.")
  try:
    if spec.endswith(".gz"):
      with gzip.open(spec, "rb") as f:
        return f.read()
    with open(spec, "rb") as f:
      return f.read()
  except (OSError, EOFError, zlib.error) as e:
    raise InputError(f"{spec}: cannot be read ({e}).") from None


def read_lines(spec: str) -> list[str]:
  """Every line of a text file (or of stdin for '-'), newline and carriage return removed; see the module rule."""
  name = "<stdin>" if spec == STDIN else spec
  data = _read_bytes(spec)
  if data.startswith(b"\xef\xbb\xbf"):
    data = data[3:]
  raw = data.split(b"\n")
  if raw and raw[-1] == b"":
    raw.pop()  # The final newline ends the last line; it does not start an empty one.
  lines = []
  for n, line in enumerate(raw, 1):
    try:
      lines.append(line.decode("utf-8").removesuffix("\r"))
    except UnicodeDecodeError as e:
      raise InputError(f"{name}: line {n} is not valid UTF-8 (byte {line[e.start]:#04x} at column {e.start + 1}); "
                       "inputs must be UTF-8 text.") from None
  return lines


def is_tsv(spec: str) -> bool:
  return spec.endswith((".tsv", ".tsv.gz"))


def read_tsv(spec: str) -> tuple[list[str], list[dict[str, str]]]:
  """(header, rows): one dict per line after the header, every header column present ('' when missing)."""
  lines = read_lines(spec)
  name = "<stdin>" if spec == STDIN else spec
  if not lines:
    raise InputError(f"{name}: empty file; a TSV needs a header row naming its columns, e.g. 'en<TAB>de'.")
  header = lines[0].split("\t")
  rows = []
  for line in lines[1:]:
    fields = line.split("\t")
    rows.append({col: fields[i] if i < len(fields) else "" for i, col in enumerate(header)})
  return header, rows


def _column(spec: str, header: list[str], rows: list[dict[str, str]], column: str) -> list[str]:
  if column not in header:
    raise InputError(f"{spec}: its header {header[:4]} has no {column!r} column; a TSV input needs a header row "
                     f"naming its columns (e.g. 'en<TAB>de'), or pass a plain text file (one input a line).")
  return [r[column] for r in rows]


def read_texts(spec: str, column: str = "en") -> list[str]:
  """The items of `spec`: a TSV's `column` (needs a header naming it), or every line of a text file / stdin."""
  if not is_tsv(spec):
    return read_lines(spec)
  return _column(spec, *read_tsv(spec), column)


def read_corpus_texts(spec: str, natural_only: bool = False) -> list[str]:
  """The non-empty English items of a text file or EN-DE TSV, for measuring (benchmark, loop profile).

  With natural_only, a TSV whose 'source' column marks natural sentences (the Ding examples) gives those only.
  """
  if not is_tsv(spec):
    texts = read_lines(spec)
  else:
    header, rows = read_tsv(spec)
    if natural_only and "source" in header and any("ding" in r["source"] for r in rows):
      rows = [r for r in rows if "ding" in r["source"]]
    texts = _column(spec, header, rows, "en")
  return [t for t in texts if t.strip()]


def parse_token_ids(lines: list[str], eos_id: int, name: str = "input") -> list[list[int]]:
  """Space-separated token ids per line, EOS appended (for models without a tokenizer)."""
  out = []
  for n, line in enumerate(lines, 1):
    try:
      out.append([int(t) for t in line.split()] + [eos_id])
    except ValueError:
      raise InputError(f"{name}: line {n} is not space-separated token ids: {line[:60]!r}.") from None
  return out


def encode_texts(tokenizer, texts: list[str], *, prefix: str = "", chat: bool = False, max_input_length: int,
                 long_inputs: str = "truncate") -> list[list[int]]:
  """Token ids per item ([] for an empty item), the prefix put first and, with chat, the chat template applied.

  Items longer than max_input_length tokens are refused (long_inputs='refuse': InputError) or truncated with a
  warning: an encoding that ends with EOS (T5's encoder inputs) keeps its head and the EOS; any other (a
  decoder-only prompt) keeps its first token (BOS) and its tail, where a chat prompt asks for the answer.
  """
  if chat and not callable(getattr(tokenizer, "apply_chat_template", None)):
    raise InputError("--chat: this model's tokenizer has no chat template (apply_chat_template).")
  out = []
  for n, text in enumerate(texts, 1):
    if not text.strip():
      out.append([])
      continue
    text = prefix + text
    if chat:
      try:
        text = tokenizer.apply_chat_template(text)
      except ValueError as e:  # e.g. transformers: "tokenizer.chat_template is not set"
        raise InputError(f"--chat: the model's tokenizer cannot apply a chat template ({e}).") from None
    ids = list(tokenizer.encode(text))
    if len(ids) > max_input_length:
      if long_inputs == "refuse":
        raise InputError(f"line {n} has {len(ids)} tokens, more than --max_input_length={max_input_length} "
                         "(use --long_inputs=truncate to cut it).")
      logging.warning("line %d has %d tokens: truncated to %d.", n, len(ids), max_input_length)
      eos = tokenizer.eos_id
      ids = (ids[:max_input_length - 1] + [eos] if ids[-1] == eos else
             ids[:1] + ids[len(ids) - max_input_length + 1:])
    out.append(ids)
  return out
