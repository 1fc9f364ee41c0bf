"""Reading checkpoint tensors straight into sharded arrays: each process copies only its own devices' slices.

A safetensors tensor is a memory map; a family's layout hook (transpose, head split) turns it into our layout as a
numpy view of that map whenever it can. `jax.make_array_from_callback` then asks for each local device's slice,
and only those bytes are copied out of the file (and converted to the parameter dtype), so no host ever holds the
whole model. A layout that cannot be a view (its hook copies) costs one full read of that tensor, counted too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np
from jax.sharding import NamedSharding


def _is_view(array: np.ndarray) -> bool:
  """True when `array` still reads through a memory map (a view of it, not a copy)."""
  base = array
  while base is not None:
    if isinstance(base, np.memmap) or isinstance(getattr(base, "obj", None), bytes) or type(base).__name__ == "mmap":
      return True
    base = getattr(base, "base", None)
  return False


@dataclasses.dataclass
class SliceReader:
  """Builds sharded arrays from lazily mapped tensors; `bytes_read` counts the bytes copied out of the files."""

  bytes_read: int = 0

  def array(self, raw: np.ndarray, sharding: NamedSharding, dtype,
            check: Callable[[np.ndarray], None] | None = None) -> jax.Array:
    """A global array of `raw`'s shape and values, in `dtype`, placed with `sharding`.

    Args:
      raw: the tensor in our layout, ideally a view of a memory-mapped file (only local slices are then read).
      check: called on each slice read (e.g. a finiteness check), before conversion.
    """
    if not _is_view(raw):  # The layout copied: the whole tensor was read.
      self.bytes_read += raw.nbytes
      raw = np.asarray(raw)
    viewed = _is_view(raw)
    slices: dict[tuple, np.ndarray] = {}  # Devices of one process that hold the same slice share one read.

    def one(index: tuple) -> np.ndarray:
      key = tuple((s.start, s.stop, s.step) for s in index)
      if key not in slices:
        part = np.asarray(raw[index])
        if viewed:
          self.bytes_read += part.nbytes
        if check is not None:
          check(part)
        slices[key] = part.astype(dtype)
      return slices[key]

    return jax.make_array_from_callback(raw.shape, sharding, one)
