"""Tokenizers: one small interface over Hugging Face tokenizers (T5's sentencepiece tokenizer, Llama / Qwen / Gemma
byte-level and sentencepiece BPE tokenizers) and their chat templates, read from a model directory. Public as
`jaxspec.tokenizer` (that module re-exports this one)."""

from __future__ import annotations

import functools
import hashlib
import os

from jaxspec.checkpoint.hf_dir import check_inside
from jaxspec.errors import InputError, NoChatTemplateError

TOKENIZER_FILES = ("tokenizer.json", "spiece.model", "tokenizer_config.json")


class Tokenizer:
  """Text <-> token ids, as transformers' tokenizer of the same directory encodes them.

  `encode` adds the special tokens the tokenizer adds (T5 appends EOS, Llama and Gemma prepend BOS, Qwen adds
  none), except to a text that already starts with the BOS token (a rendered chat template): that text is encoded
  as transformers' `apply_chat_template(..., tokenize=True)` encodes it, without a second BOS. `decode` drops
  special tokens.
  """

  def __init__(self, hf_tokenizer):
    self.hf_tokenizer = hf_tokenizer

  def encode(self, text: str) -> list[int]:
    bos = self.hf_tokenizer.bos_token
    add_special = not (bos and text.startswith(bos))
    return list(self.hf_tokenizer(text, add_special_tokens=add_special)["input_ids"])

  def apply_chat_template(self, text_or_messages) -> str:
    """The prompt text for a chat model: one user message (a str) or a list of {"role", "content"} messages,
    rendered by the tokenizer's chat template with the assistant's turn opened (add_generation_prompt).

    `encode` of the result equals transformers' `apply_chat_template(messages, tokenize=True,
    add_generation_prompt=True)`: no double BOS. Raises NoChatTemplateError when the tokenizer has no template,
    InputError for anything but a str or a list of {"role", "content"} dicts, and ValueError when the template renders a text that `encode` cannot reproduce (no BOS in the template while
    the tokenizer adds special tokens).
    """
    if not getattr(self.hf_tokenizer, "chat_template", None):
      raise NoChatTemplateError(f"the tokenizer {self.hf_tokenizer.name_or_path!r} has no chat template (not a chat "
                                f"or instruct model): pass plain prompts.")
    messages = [{"role": "user", "content": text_or_messages}] if isinstance(text_or_messages, str) else (
        text_or_messages)
    if not isinstance(messages, (list, tuple)) or not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in messages):
      raise InputError(f"apply_chat_template takes one user message (a str) or a non-empty list of "
                       f"{{'role': str, 'content': ...}} messages, got {type(text_or_messages).__name__} "
                       f"{str(text_or_messages)[:80]!r}.")
    messages = list(messages)
    text = self.hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = self.hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    if self.encode(text) != list(want):
      raise ValueError(f"the chat template of {self.hf_tokenizer.name_or_path!r} renders no BOS but the tokenizer "
                       f"adds special tokens to every text: encode() would not reproduce transformers' ids.")
    return text

  def decode(self, ids) -> str:
    return self.hf_tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

  @property
  def vocab_size(self) -> int:
    """Tokens the tokenizer can produce (added tokens included); a model's embedding may have more rows."""
    return len(self.hf_tokenizer)

  @property
  def pad_id(self) -> int:
    return self.hf_tokenizer.pad_token_id

  @property
  def eos_id(self) -> int:
    return self.hf_tokenizer.eos_token_id

  @property
  def bos_id(self) -> int | None:
    """The BOS id, or None (T5 and Qwen tokenizers have none)."""
    return self.hf_tokenizer.bos_token_id

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


def _check_tokenizer_config(directory: str) -> None:
  """Refuses a tokenizer_config.json whose file entries (vocab_file, merges_file, tokenizer_file, ...) leave the
  directory: a tokenizer reads only its own directory's files."""
  import json
  path = os.path.join(directory, "tokenizer_config.json")
  if not os.path.exists(path):
    return
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
  except (OSError, ValueError):
    return  # transformers reports an unreadable file.
  for key, value in (config.items() if isinstance(config, dict) else ()):
    if key.endswith("_file") and isinstance(value, str):
      check_inside(path, key, value)


def load_tokenizer(directory: str) -> Tokenizer | None:
  """The tokenizer saved in a model directory, or None when it has no tokenizer files.

  Never runs code from the directory: transformers is called with trust_remote_code=False, so a tokenizer_config
  `auto_map` naming the directory's Python is neither imported nor asked about (no prompt on a terminal).
  """
  if not any(os.path.exists(os.path.join(directory, f)) for f in TOKENIZER_FILES):
    return None
  _check_tokenizer_config(directory)
  from transformers import AutoTokenizer  # Imported lazily: transformers is slow to import.
  return Tokenizer(AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False))


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
