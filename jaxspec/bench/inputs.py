"""The benchmark scripts' inputs: token ids of the first N inputs of a file, a corpus split or a file of chats.

    ids = prompt_ids(target, "docs/bench/qwen_prompts.jsonl", 4)   # chats, rendered by the target's chat template

Shared by launch/benchmark.py and launch/tree_benchmark.py, so both encode the same prompts the same way.
"""

from __future__ import annotations

import json

from jaxspec.tools.batching import MAX_INPUT_LENGTH
from jaxspec.tools.inputs import encode_texts, parse_token_ids, read_corpus_texts, read_lines
from jaxspec.errors import InputError


def read_chats(spec: str) -> list[list[dict]]:
  """The "messages" list of every non-empty line of a .jsonl file of chats ({"messages": [...]})."""
  try:
    return [json.loads(line)["messages"] for line in read_lines(spec) if line.strip()]
  except (ValueError, KeyError, TypeError) as e:  # bad JSON, no "messages"
    raise InputError(f"{spec}: every line must be a chat {{\"messages\": [...]}} ({type(e).__name__}: {e}).") from None


def prompt_ids(target, spec: str, sentences: int, *, natural_only: bool = True, token_ids: bool = False,
               prefix: str = "", chat: bool = False) -> list[list[int]]:
  """Token ids of the first `sentences` inputs of `spec`, encoded for `target` (a `jaxspec.Model`).

  Args:
    spec: a .jsonl file of chats (always rendered by the target tokenizer's chat template, Qwen's default system
      message included), a text file (one input a line), an EN-DE TSV ('en' column) or a file of token ids.
    natural_only: from a corpus TSV, the natural sentences only.
    token_ids: the file holds space-separated token ids (models without a tokenizer).
    prefix, chat: put before every text input (T5's task prefix); apply the chat template to every text input.
  Raises:
    InputError: a model without the tokenizer the input needs, a bad chat file.
  """
  if spec.endswith(".jsonl"):
    if target.tokenizer is None:
      raise InputError(f"{spec}: chats need a target with a tokenizer.")
    chats = read_chats(spec)[:sentences]
    try:
      return [target.tokenizer.encode(target.tokenizer.apply_chat_template(m)) for m in chats]
    except (ValueError, TypeError) as e:  # no chat template, a malformed message
      raise InputError(f"{spec}: the target's chat template cannot render these chats ({type(e).__name__}: {e}).") \
          from None
  texts = read_corpus_texts(spec, natural_only)[:sentences]
  if token_ids:
    return parse_token_ids(texts, target.config.eos_token_id, spec)
  if target.tokenizer is None:
    raise InputError(f"{target.name} has no tokenizer: pass a file of token ids (--input_is_token_ids).")
  return encode_texts(target.tokenizer, texts, prefix=prefix, chat=chat, max_input_length=MAX_INPUT_LENGTH)
