"""Tokenizers: one small interface over Hugging Face tokenizers (T5's sentencepiece tokenizer included)."""

from __future__ import annotations

import functools
import hashlib
import os

TOKENIZER_FILES = ("tokenizer.json", "spiece.model", "tokenizer_config.json")


class Tokenizer:
  """Text <-> token ids. `encode` appends EOS, as T5 expects of encoder inputs; `decode` drops special tokens."""

  def __init__(self, hf_tokenizer):
    self.hf_tokenizer = hf_tokenizer

  def encode(self, text: str) -> list[int]:
    return list(self.hf_tokenizer(text, add_special_tokens=True)["input_ids"])

  def decode(self, ids) -> str:
    return self.hf_tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

  @property
  def vocab_size(self) -> int:
    return len(self.hf_tokenizer)

  @property
  def pad_id(self) -> int:
    return self.hf_tokenizer.pad_token_id

  @property
  def eos_id(self) -> int:
    return self.hf_tokenizer.eos_token_id

  @functools.cached_property
  def fingerprint(self) -> str:
    """A digest of the special ids and the whole token -> id map (computed once: the map has V entries)."""
    items = sorted(self.hf_tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    text = repr((self.pad_id, self.eos_id, items))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

  def same_as(self, other: "Tokenizer") -> bool:
    """True when both map every token string to the same id (what draft and target must share)."""
    return self is other or self.fingerprint == other.fingerprint

  def save(self, directory: str) -> None:
    self.hf_tokenizer.save_pretrained(directory)


def load_tokenizer(directory: str) -> Tokenizer | None:
  """The tokenizer saved in a model directory, or None when it has no tokenizer files."""
  if not any(os.path.exists(os.path.join(directory, f)) for f in TOKENIZER_FILES):
    return None
  from transformers import AutoTokenizer  # Imported lazily: transformers is slow to import.
  return Tokenizer(AutoTokenizer.from_pretrained(directory, local_files_only=True))


def write_sentencepiece_tokenizer(spiece_model: str, directory: str, extra_ids: int = 0) -> None:
  """Installs a sentencepiece model in `directory` as an HF T5 tokenizer (spiece.model + tokenizer_config.json).

  The model must follow T5's special ids (pad 0, eos 1, unk 2); `load_tokenizer(directory)` then reads it.
  """
  import json
  import shutil
  os.makedirs(directory, exist_ok=True)
  shutil.copy(spiece_model, os.path.join(directory, "spiece.model"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": extra_ids, "eos_token": "</s>",
               "unk_token": "<unk>", "pad_token": "<pad>"}, f, indent=2)
