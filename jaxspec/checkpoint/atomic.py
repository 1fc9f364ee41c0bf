"""Atomic directory writes: build a directory beside its destination, then swap it into place in one rename.

On Linux the swap of an existing directory uses renameat2(RENAME_EXCHANGE), so at every instant the destination
path holds either the complete old directory or the complete new one; a killed process leaves at most a stale
`.<name>.staging-*` sibling, never a half-written destination. Where the exchange is unavailable (other systems,
old kernels), the old directory is first renamed aside, which leaves a window of two renames without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import tempfile
from typing import Iterator

from jaxspec.errors import CheckpointError

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
  """Swaps two existing paths atomically; False when the system cannot."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    renameat2 = libc.renameat2
  except (OSError, AttributeError):
    return False
  renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
  return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


# What jaxspec writes (and Hugging Face directories hold): configs, weights, tokenizer files, an Orbax params/.
MODEL_FILES = frozenset((
    "config.json", "generation_config.json", "jaxspec.json", "model.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "spiece.model", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
    "chat_template.jinja", "chat_template.json"))
_SHARD = re.compile(r"(model-\d+-of-\d+\.safetensors|pytorch_model-\d+-of-\d+\.bin)")
_ORBAX_METADATA = ("_CHECKPOINT_METADATA", "_METADATA")


def _unexpected_entries(directory: str) -> list[str]:
  """Entries of `directory` that a model directory jaxspec writes never holds (a trailing / marks a folder; a
  symlink is never jaxspec's, so a Hugging Face cache snapshot is never replaced)."""
  out = []
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if os.path.isfile(path) and not os.path.islink(path) and (name in MODEL_FILES or _SHARD.fullmatch(name)):
      continue
    if (name == "params" and os.path.isdir(path) and not os.path.islink(path)
        and os.path.exists(os.path.join(directory, "jaxspec.json"))
        and any(os.path.exists(os.path.join(path, m)) for m in _ORBAX_METADATA)):
      continue  # An Orbax tree of a jaxspec save.
    out.append(name + (" (a symlink)" if os.path.islink(path) else "/" if os.path.isdir(path) else ""))
  return out


def _protected(path: str) -> str | None:
  """Why `path` (absolute, resolved) may never be replaced: the working directory or one of its ancestors, the
  home directory or one of its ancestors, the root; None when it may."""
  try:
    cwd = os.getcwd()
  except OSError:  # The working directory was removed: nothing there to protect.
    cwd = None
  for what, where in (("the current working directory", cwd), ("the home directory", os.path.expanduser("~"))):
    if not where or where == "~":
      continue
    where = os.path.realpath(where)
    if path == where:
      return what
    if where.startswith(path.rstrip(os.sep) + os.sep):
      return f"an ancestor of {what} ({where})"
  return "the root directory" if path == os.path.dirname(path) else None


def resolve_destination(directory, marker_files: tuple[str, ...] = ("config.json",)) -> str:
  """The absolute path a save into `directory` replaces, after refusing every destination that would lose data.

  Refused (CheckpointError naming the path and why): a non-path or empty path; the working directory, the home
  directory, any of their ancestors, the root; a path under a regular file; an existing file; a non-empty
  directory without one of `marker_files` or holding any entry that jaxspec does not write (the message lists
  them). A symlink is followed: the save replaces the directory it points to and the link stays.
  """
  if not isinstance(directory, (str, os.PathLike)):
    raise CheckpointError(f"the destination must be a directory path, got {type(directory).__name__}.")
  given = os.fspath(directory)
  if not given.strip():
    raise CheckpointError(f"the destination directory is empty ({given!r}): it would be the current working "
                          f"directory. Name a new or model directory.")
  path = os.path.realpath(given)
  shown = given if path == os.path.abspath(given) else f"{given} (-> {path})"
  why = _protected(path)
  if why:
    raise CheckpointError(f"{shown}: refusing to replace {why}. Save into a new or model directory.")
  ancestor = os.path.dirname(path)
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise CheckpointError(f"{shown}: cannot create it: {ancestor} is a file, not a directory.")
  if os.path.lexists(path) and not os.path.isdir(path):
    raise CheckpointError(f"{shown}: exists and is not a directory.")
  if os.path.isdir(path) and os.listdir(path):
    unexpected = _unexpected_entries(path)
    if unexpected or not any(os.path.isfile(os.path.join(path, m)) for m in marker_files):
      listed = ", ".join(unexpected[:10]) + (" ..." if len(unexpected) > 10 else "")
      raise CheckpointError(
          f"{shown}: not a model checkpoint that jaxspec wrote (" +
          (f"unexpected entries: {listed}" if unexpected else f"no {' or '.join(marker_files)}") +
          "): refusing to replace it, which would delete them. Save into a new or empty directory.")
  return path


def check_replaceable(directory: str, marker_files: tuple[str, ...] = ("config.json",)) -> None:
  """`resolve_destination`, for callers that need only the refusal."""
  resolve_destination(directory, marker_files)


@contextlib.contextmanager
def staging_dir(directory: str) -> Iterator[str]:
  """Yields an empty sibling directory to write into; on success it replaces `directory` whole.

  `directory` is checked by `resolve_destination` first (a symlink is followed: its target is replaced). On any
  error the staging directory is removed, so a failed save leaves the previous directory and nothing else.
  """
  directory = resolve_destination(directory)
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.staging-", dir=parent)
  try:
    yield staging
    for root, _, files in os.walk(staging):  # Data on disk before the rename makes it visible.
      for name in files:
        with open(os.path.join(root, name), "rb") as f:
          os.fsync(f.fileno())
    if not os.path.exists(directory):
      os.rename(staging, directory)
    elif _exchange(staging, directory):
      shutil.rmtree(staging)  # Now holds the old directory.
    else:
      aside = staging + ".old"
      os.rename(directory, aside)
      os.rename(staging, directory)
      shutil.rmtree(aside)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
