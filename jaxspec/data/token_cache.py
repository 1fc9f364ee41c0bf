"""Tokenized training pairs, cached in the workdir and keyed on what they depend on.

The cache (WORKDIR/train_tokens.json) records its key: the training file's absolute path, size and modification
time, and the tokenizer's fingerprint (`Tokenizer.fingerprint`: special ids and the whole token -> id map). A
cache whose key differs (another --config.train, an edited file, another tokenizer) or that cannot be read (a
truncated write) is rebuilt; it is written atomically, so a kill never leaves a partial one.
"""

from __future__ import annotations

import json
import logging
import os

from jaxspec.data.ende import read_pairs
from jaxspec.tools.outputs import atomic_write_json

VERSION = 1


def cache_key(train_path: str, tokenizer) -> dict:
  st = os.stat(train_path)
  return {"version": VERSION, "path": os.path.abspath(train_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
          "tokenizer": tokenizer.fingerprint}


def tokenize(tokenizer, texts) -> list[list[int]]:
  """Token ids (EOS appended) of many texts in one batched tokenizer call."""
  return [list(ids) for ids in tokenizer.hf_tokenizer(list(texts))["input_ids"]]


def _load(cache_path: str, key: dict) -> tuple[list, list] | None:
  if not os.path.exists(cache_path):
    return None
  try:
    with open(cache_path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    logging.warning("%s cannot be read (%s): tokenizing again.", cache_path, e)
    return None
  if not isinstance(data, dict) or data.get("key") != key:
    old = data.get("key") if isinstance(data, dict) else None
    logging.warning("%s was made for other data or another tokenizer (%s, now %s): tokenizing again.", cache_path,
                    old and {k: old.get(k) for k in ("path", "size")}, {k: key[k] for k in ("path", "size")})
    return None
  return data["src"], data["tgt"]


def tokenized_pairs(train_path: str, tokenizer, cache_path: str) -> tuple[list[list[int]], list[list[int]]]:
  """(source ids, target ids) of every pair of train_path, from the cache when its key matches."""
  key = cache_key(train_path, tokenizer)
  cached = _load(cache_path, key)
  if cached is not None:
    return cached
  pairs = read_pairs(train_path)
  src, tgt = tokenize(tokenizer, (p.en for p in pairs)), tokenize(tokenizer, (p.de for p in pairs))
  atomic_write_json(cache_path, {"key": key, "src": src, "tgt": tgt})
  return src, tgt
