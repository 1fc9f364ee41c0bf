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


def check_replaceable(directory: str, marker_files: tuple[str, ...]) -> None:
  """Refuses a destination that is a file, or a non-empty directory holding none of `marker_files`."""
  if os.path.isfile(directory) or (os.path.exists(directory) and not os.path.isdir(directory)):
    raise CheckpointError(f"{directory}: exists and is not a directory.")
  if os.path.isdir(directory) and os.listdir(directory) and not any(
      os.path.exists(os.path.join(directory, m)) for m in marker_files):
    raise CheckpointError(f"{directory}: a non-empty directory that is not a model checkpoint (no "
                          f"{' or '.join(marker_files)}): refusing to replace it. Save into a new or empty "
                          f"directory.")


@contextlib.contextmanager
def staging_dir(directory: str) -> Iterator[str]:
  """Yields an empty sibling directory to write into; on success it replaces `directory` whole."""
  directory = os.path.abspath(directory)
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
