"""Hugging Face model directories: their weight files, read by a family's weight table, and written back.

Weights: `model.safetensors`, sharded safetensors with `model.safetensors.index.json`, or `pytorch_model.bin`
(sharded or not; needs torch, read with weights_only=True). Safetensors are read without torch.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np

from jaxspec.sharding import param_shardings
from jaxspec.errors import CheckpointError
from jaxspec.checkpoint.safetensors_io import SafetensorsFile
from jaxspec.checkpoint.sharded_read import SliceReader
from jaxspec.models import hf_table
from jaxspec.models.registry import Family


class TensorSource:
  """Name -> array over the weight files of one HF directory (single file or sharded with an index)."""

  def __init__(self, directory: str):
    self.directory = directory
    self._where: dict[str, tuple[str, object]] = {}
    for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model.bin")):
      index_path = os.path.join(directory, index_name)
      if os.path.exists(index_path):
        files = _index_files(index_path)
        break
      if os.path.exists(os.path.join(directory, single)):
        files = [single]
        break
    else:
      raise CheckpointError(f"{directory}: no weights (model.safetensors, model.safetensors.index.json, "
                            f"pytorch_model.bin or pytorch_model.bin.index.json).")
    self.files = [os.path.join(directory, name) for name in files]  # The weight files, in the index's order.
    for name in files:
      path = os.path.join(directory, name)
      if not os.path.exists(path):
        raise CheckpointError(f"{path}: listed in the index but missing.")
      reader = SafetensorsFile(path) if name.endswith(".safetensors") else _TorchFile(path)
      for key in reader.keys():
        self._where[key] = (path, reader)

  def names(self) -> set[str]:
    return set(self._where)

  def file_of(self, name: str) -> str:
    return self._where[name][0]

  def shape(self, name: str) -> tuple[int, ...]:
    return self._where[name][1].shape(name)

  def get(self, name: str) -> np.ndarray:
    return self._where[name][1].get(name)

  def dtype(self, name: str) -> np.dtype:
    return self._where[name][1].dtype(name)


def _index_files(index_path: str) -> list[str]:
  try:
    with open(index_path) as f:
      index = json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{index_path}: cannot parse: {e}") from e
  weight_map = index.get("weight_map") if isinstance(index, dict) else None
  if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
    raise CheckpointError(f"{index_path}: no 'weight_map' of tensor name -> file name.")
  files = sorted(set(weight_map.values()))
  for name in files:
    check_inside(index_path, "weight_map", name)
  return files


def check_inside(named_in: str, key: str, name: str) -> None:
  """Refuses a file name that a model directory's `named_in` file gives (under `key`) and that leaves the
  directory: an absolute path, or one whose `..` climbs out. Names are checked as written, so the symlinks of a
  Hugging Face cache snapshot (into its blobs/) still load."""
  normal = os.path.normpath(name)
  if not name or os.path.isabs(name) or normal == ".." or normal.startswith(".." + os.sep):
    raise CheckpointError(f"{named_in}: {key} names {name!r}, a path outside the model directory "
                          f"{os.path.dirname(named_in)}: refused (a model directory names only its own files).")


class _TorchFile:
  """A pytorch_model.bin shard, read with torch.load(weights_only=True). Needs torch."""

  def __init__(self, path: str):
    try:
      import torch
    except ImportError as e:
      raise CheckpointError(f"{path}: reading pytorch_model.bin needs torch (pip install torch); "
                            f"safetensors checkpoints do not.") from e
    try:
      self._tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch raises many types for corrupt archives.
      raise CheckpointError(f"{path}: cannot read: {e}") from e

  def keys(self):
    return list(self._tensors)

  def shape(self, name):
    return tuple(self._tensors[name].shape)

  def get(self, name):
    import torch
    t = self._tensors[name]
    return t.to(torch.float32).numpy() if t.is_floating_point() else t.numpy()

  def dtype(self, name):
    t = self._tensors[name]
    return np.dtype(np.float32) if t.is_floating_point() else self.get(name).dtype


def load_params(directory: str, family: Family, cfg, dtype, check_finite: bool = True, mesh=None, rules=None,
                reader: SliceReader | None = None):
  """Reads every tensor of `family.weight_table` from an HF directory. Returns (config fitted to the weights,
  params). Raises CheckpointError naming the file and tensor for missing, unused or misshapen tensors, for
  integer or boolean tensors where weights belong, and (unless check_finite=False, which skips a pass over every
  weight on huge checkpoints) for tensors holding NaN or infinite values, or values that `dtype` cannot hold
  (float16 above 65504: checked as the cast would round them).

  With a `mesh`, every parameter is placed by the logical-axis `rules` (jaxspec.sharding) and each process reads
  only the slices of its own devices (`reader` counts the bytes; the finiteness check then covers those slices).
  """
  source = TensorSource(directory)
  cfg = family.fit_to_checkpoint(cfg, source.names(), source.get)
  shardings = None if mesh is None else param_shardings(family, cfg, mesh, rules)[0]
  reader = reader or SliceReader()
  table = family.weight_table(cfg)
  shapes = family.param_shapes(cfg)
  expected = {row.hf_name for row in table}
  unexpected = sorted(source.names() - expected - set(family.ignored_hf_names(cfg)))
  if unexpected:
    raise CheckpointError(f"{directory}: tensors that this {family.name} config does not use (config.json and "
                          f"weights disagree?): {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''} in "
                          f"{source.file_of(unexpected[0])}.")
  dtype = jnp.dtype(dtype)
  narrow = jnp.finfo(dtype).max < jnp.finfo(jnp.float32).max  # float16: float32 values may overflow to inf.
  params: dict = {}
  for row in table:
    if row.hf_name not in source.names():
      tied = (" (config.json has tie_word_embeddings=false: the head is not the embedding)"
              if row.hf_name == "lm_head.weight" else "")
      raise CheckpointError(f"{', '.join(source.files)}: missing tensor {row.hf_name!r} (needed for "
                            f"{'/'.join(map(str, row.path))}){tied}.")
    want = hf_table.get_path(shapes, row.path)
    got = source.shape(row.hf_name)
    hf_want = row.layout.to_hf(np.empty(want, np.uint8), cfg).shape
    if tuple(got) != tuple(hf_want):
      raise CheckpointError(f"{source.file_of(row.hf_name)}: tensor {row.hf_name!r} has shape {tuple(got)}, "
                            f"config.json implies {tuple(hf_want)}.")
    stored = source.dtype(row.hf_name)
    if not np.issubdtype(stored, np.floating) and stored.name != "bfloat16":
      raise CheckpointError(f"{source.file_of(row.hf_name)}: tensor {row.hf_name!r} is stored as {stored}, not a "
                            f"floating-point type: not model weights (corrupt or wrong file).")
    def check(array, name=row.hf_name, bf16=stored.name == "bfloat16"):
      if not check_finite:
        return
      values = array.astype(np.float32) if bf16 else array
      if not np.isfinite(values).all():
        raise CheckpointError(f"{source.file_of(name)}: tensor {name!r} holds NaN or infinite values "
                              f"(load(..., check_finite=False) skips this check).")
      if narrow and values.size:  # Finite here, infinite after the cast (float16 ends at 65504)?
        largest = float(np.max(np.abs(values)))
        with np.errstate(over="ignore"):
          cast = np.asarray(largest, np.float32).astype(dtype)
        if not np.isfinite(cast):
          raise CheckpointError(f"{source.file_of(name)}: tensor {name!r} holds {largest:g}, beyond {dtype.name}'s "
                                f"largest value {float(jnp.finfo(dtype).max):g}: it would load as inf. Load in "
                                f"float32 or bfloat16 (load(..., check_finite=False) skips this check).")
    ours = row.layout.to_ours(source.get(row.hf_name), cfg)  # A view of the memory map (layouts permitting).
    if shardings is not None:
      hf_table.set_path(params, row.path, reader.array(ours, hf_table.get_path(shardings, row.path), dtype, check))
      continue
    array = np.asarray(ours)
    check(array)
    hf_table.set_path(params, row.path, jnp.asarray(array, dtype=dtype))
  return cfg, params


def to_hf_state_dict(family: Family, cfg, params, dtype=None) -> dict[str, np.ndarray]:
  """HF-named numpy arrays for `params` (dtype None keeps the parameters' dtype)."""
  out = {}
  for row in family.weight_table(cfg):
    array = np.asarray(hf_table.get_path(params, row.path))
    if dtype is not None:
      array = array.astype(dtype)
    out[row.hf_name] = np.ascontiguousarray(row.layout.to_hf(array, cfg))
  return out
