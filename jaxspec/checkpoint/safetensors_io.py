"""A small safetensors reader and writer that needs neither torch nor the `safetensors` package.

Reading memory-maps the file, so a 45 GB checkpoint is read tensor by tensor, and checks the file against its
header so that a truncated or corrupt file fails with an error naming the file and the tensor. Writing handles
bfloat16 (via ml_dtypes), which numpy alone cannot.

Format: 8-byte little-endian header length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin,
end]}, "__metadata__": {...}}, then the raw little-endian tensor bytes. Sharded, as transformers writes it:
model-0000i-of-0000n.safetensors files and model.safetensors.index.json ({"metadata": {"total_size": bytes},
"weight_map": {name: file}}); `shard_groups`, `shard_file` and `write_index` write that layout (`shard_safetensors`
splits a written model.safetensors, jaxspec/checkpoint/gguf.py converts straight into it).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterable, TypeVar

import ml_dtypes
import numpy as np

from jaxspec.errors import CheckpointError

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
INDEX = "model.safetensors.index.json"
_T = TypeVar("_T")


class SafetensorsFile:
  """Lazy access to the tensors of one .safetensors file: `keys()`, `shape(name)`, `get(name)`."""

  def __init__(self, path: str):
    self.path = path
    try:
      size = os.path.getsize(path)
      with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
          raise CheckpointError(f"{path}: not a safetensors file (only {size} bytes).")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > size - 8:
          raise CheckpointError(f"{path}: truncated or corrupt safetensors header (says {header_len} bytes, "
                                f"the file has {size}).")
        header = json.loads(f.read(header_len))
    except (OSError, ValueError, UnicodeDecodeError) as e:
      if isinstance(e, CheckpointError):
        raise
      raise CheckpointError(f"{path}: cannot read safetensors header: {e}") from e
    if not isinstance(header, dict):
      raise CheckpointError(f"{path}: corrupt safetensors header: expected a JSON object, got "
                            f"{type(header).__name__}.")
    header.pop("__metadata__", None)
    self._header = header
    self._data_start = 8 + header_len
    self._size = size
    self._check_header()

  def _check_header(self) -> None:
    """Every entry has a known dtype, a shape and data offsets that match it; no two tensors share bytes."""
    spans = []
    for name, info in self._header.items():
      if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise CheckpointError(f"{self.path}: tensor {name!r}: corrupt header entry (needs dtype, shape and "
                              f"data_offsets), got {info!r}.")
      if info["dtype"] not in _DTYPES:
        raise CheckpointError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']!r}.")
      shape, offsets = info["shape"], info["data_offsets"]
      if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
          or not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
          or not 0 <= offsets[0] <= offsets[1]):
        raise CheckpointError(f"{self.path}: tensor {name!r}: corrupt shape {shape!r} or data_offsets "
                              f"{offsets!r}.")
      spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
      if b1 < e0 and b1 < e1 and b0 < e0:
        raise CheckpointError(f"{self.path}: tensors {n0!r} and {n1!r} overlap in the file (data offsets "
                              f"[{b0}, {e0}) and [{b1}, {e1})): corrupt file.")

  def dtype(self, name: str) -> np.dtype:
    """The stored dtype of tensor `name`."""
    return np.dtype(_DTYPES[self._header[name]["dtype"]])

  def keys(self) -> list[str]:
    return list(self._header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._header[name]["shape"])

  def get(self, name: str) -> np.ndarray:
    """The tensor `name` as a numpy array (memory-mapped, read-only)."""
    info = self._header[name]
    dtype = self.dtype(name)
    begin, end = info["data_offsets"]
    expected = int(np.prod(info["shape"], dtype=np.int64)) * dtype.itemsize
    if end - begin != expected:
      raise CheckpointError(f"{self.path}: tensor {name!r} has {end - begin} bytes for shape {info['shape']} "
                            f"{info['dtype']} (expected {expected}): corrupt file.")
    if self._data_start + end > self._size:
      raise CheckpointError(f"{self.path}: truncated file: tensor {name!r} needs bytes up to "
                            f"{self._data_start + end}, the file has {self._size}.")
    if expected == 0:
      return np.zeros(info["shape"], dtype)
    arr = np.memmap(self.path, dtype=dtype, mode="r", offset=self._data_start + begin, shape=tuple(info["shape"]))
    return arr


def save_file(tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str] | None = None) -> None:
  """Writes numpy arrays (float32, float16, bfloat16, ints) to a .safetensors file."""
  header, offset, arrays = {}, 0, []
  for name, value in tensors.items():
    arr = np.ascontiguousarray(value)
    if arr.dtype not in _NAMES:
      raise ValueError(f"Cannot write tensor {name!r} of dtype {arr.dtype} to safetensors.")
    header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + arr.nbytes]}
    offset += arr.nbytes
    arrays.append(arr)
  if metadata:
    header["__metadata__"] = metadata
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # Align the data section to 8 bytes.
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for arr in arrays:
      f.write(arr.tobytes())


def shard_groups(items: Iterable[tuple[_T, int]], max_bytes: int) -> list[list[_T]]:
  """(item, nbytes) pairs, in order, cut into consecutive shards of at most max_bytes each (an item larger than
  that is a shard of its own); one shard when everything fits."""
  shards, size = [[]], 0
  for item, nbytes in items:
    if shards[-1] and size + nbytes > max_bytes:
      shards, size = shards + [[]], 0
    shards[-1].append(item)
    size += nbytes
  return shards


def shard_file(i: int, n: int) -> str:
  """The file name of shard i (from 0) of n: model-0000{i+1}-of-0000n.safetensors."""
  return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_index(directory: str, weight_map: dict[str, str], total_size: int) -> None:
  """directory/model.safetensors.index.json: {"metadata": {"total_size"}, "weight_map": {name: shard file}}."""
  with open(os.path.join(directory, INDEX), "w") as f:
    json.dump({"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)


def shard_safetensors(directory: str, max_bytes: int) -> None:
  """Splits directory/model.safetensors into model-0000i-of-0000n.safetensors + index when it is over max_bytes
  (each shard at most max_bytes unless it holds one larger tensor); a file that fits is left as it is."""
  path = os.path.join(directory, "model.safetensors")
  if os.path.getsize(path) <= max_bytes:
    return
  source = SafetensorsFile(path)
  shards = shard_groups(((name, source.get(name).nbytes) for name in source.keys()), max_bytes)
  weight_map = {}
  for i, names in enumerate(shards):
    file = shard_file(i, len(shards))
    save_file({n: source.get(n) for n in names}, os.path.join(directory, file), metadata={"format": "pt"})
    weight_map.update({n: file for n in names})
  write_index(directory, weight_map, sum(source.get(n).nbytes for n in weight_map))
  del source
  os.remove(path)
