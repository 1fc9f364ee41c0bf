"""`generate`'s arguments checked and turned into arrays: inputs to padded ids, seeds (the draft/target pairing
check is the model drafter's: drafters/model_drafter.py).

Every user mistake is a `jaxspec.JaxspecError` naming the argument (`InputError` for inputs, `SettingsError` for
the rest), never a raw TypeError from deep inside, and never a silent
conversion (float token ids are refused, not truncated; seeds out of range are refused, not wrapped).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np

from jaxspec.checks import check_seed, is_int
from jaxspec.errors import InputError, SettingsError
from jaxspec.models.loaded import Model

MIN_BUCKET = 16


def bucket_length(n: int, max_input_length: int) -> int:
  """The padded prompt length for a longest prompt of n tokens: a power of two >= 16, capped at the max."""
  return min(max(MIN_BUCKET, 1 << math.ceil(math.log2(max(n, 1)))), max(max_input_length, n))


def seeds_for_rows(seed, batch: int) -> tuple[np.ndarray, np.ndarray]:
  """(seeds [B] uint32, row_ids [B] int32) for the loop: one int seed is shared and the row index folded in; a
  sequence gives each row its own seed (and nothing else: a row's draws then depend on its seed only)."""
  check = check_seed
  if is_int(seed):
    check(seed, "seed")
    return np.full((batch,), seed, np.uint32), np.arange(batch, dtype=np.int32)
  if isinstance(seed, (str, bytes)) or not hasattr(seed, "__len__"):
    raise SettingsError(f"seed must be an integer or a sequence of one integer per row, got {seed!r}.")
  seeds = list(seed.tolist() if isinstance(seed, np.ndarray) else seed)
  if len(seeds) != batch:
    raise SettingsError(f"seed has {len(seeds)} entries for a batch of {batch} rows: give one per row.")
  for i, s in enumerate(seeds):
    check(s, f"seed[{i}]")
  return np.asarray(seeds, np.uint32), np.zeros((batch,), np.int32)


def _token_rows(inputs, pad_id: int) -> list:
  """Rows of texts or token-id sequences from any accepted input form (not yet validated per token)."""
  kinds = "a list of texts, a list of token-id lists, or a [batch, length] integer array"
  if isinstance(inputs, str):
    raise InputError("inputs must be a batch: wrap a single text in a list.")
  if isinstance(inputs, (np.ndarray, jax.Array)):
    array = np.asarray(inputs)
    if array.ndim != 2:
      raise InputError(f"inputs as an array must be [batch, length] token ids, got shape {array.shape}.")
    if not np.issubdtype(array.dtype, np.integer):
      raise InputError(f"inputs as an array must hold integer token ids, got dtype {array.dtype}.")
    # Trailing pads are padding.
    return [r[:np.flatnonzero(r != pad_id)[-1] + 1].tolist() if (r != pad_id).any() else [] for r in array]
  if isinstance(inputs, (bytes, dict, set)) or not isinstance(inputs, Sequence):
    raise InputError(f"inputs must be {kinds}, got {type(inputs).__name__}.")
  return list(inputs)


def prepare_inputs(target: Model, inputs, max_input_length: int) -> tuple[np.ndarray, np.ndarray]:
  """(ids [B, S_bucket] right-padded with the pad id, lengths [B]) from texts, lists of ids, or a padded array."""
  pad = target.config.pad_token_id
  rows = _token_rows(inputs, pad)
  if not rows:
    raise InputError("inputs is an empty batch.")
  if all(isinstance(r, str) for r in rows):
    if target.tokenizer is None:
      raise InputError("inputs are texts but the target has no tokenizer: pass token ids.")
    rows = [target.tokenizer.encode(r) for r in rows]
  vocab = target.config.vocab_size
  for i, r in enumerate(rows):
    if isinstance(r, str):
      raise InputError(f"inputs row {i} is a text but other rows are token ids: pass one kind.")
    if (isinstance(r, (bytes, dict, set)) or not isinstance(r, Sequence)) and not isinstance(r, np.ndarray):
      raise InputError(f"inputs row {i} must be a text or a list of token ids, got {type(r).__name__}.")
    rows[i] = check_ids(r, f"inputs row {i}", vocab, max_input_length)
  width = bucket_length(max(len(r) for r in rows), max_input_length)
  ids = np.full((len(rows), width), pad, np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  return ids, np.asarray([len(r) for r in rows], np.int32)


def check_ids(ids, what: str, vocab: int, max_input_length: int) -> list[int]:
  """One prompt's token ids (a sequence, or a 1-D array), checked: 1..max_input_length integers in [0, vocab). The
  one prompt check of `generate` (per row) and the slot engine (per request); `what` names the prompt in the
  InputError ("inputs row 3", "the prompt")."""
  if isinstance(ids, np.ndarray):
    if ids.ndim != 1:
      raise InputError(f"{what} must be a list of token ids, got an array of shape {ids.shape}.")
    ids = ids.tolist()
  ids = list(ids)
  if not ids:
    raise InputError(f"{what} is empty.")
  bad = next((t for t in ids if not is_int(t)), None)
  if not all(is_int(t) for t in ids):
    raise InputError(f"{what} has a token id that is not an integer: {bad!r}.")
  if len(ids) > max_input_length:
    raise InputError(f"{what} has {len(ids)} tokens, more than max_input_length={max_input_length}: "
                     f"truncate it or raise max_input_length.")
  if min(ids) < 0 or max(ids) >= vocab:
    raise InputError(f"{what} has token ids outside [0, {vocab}).")
  return [int(t) for t in ids]
