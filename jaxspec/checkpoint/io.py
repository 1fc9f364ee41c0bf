"""`jaxspec.load` and `jaxspec.save`: Hugging Face T5 directories, Orbax checkpoints and named embedded models.

Hugging Face directories: `config.json` plus `model.safetensors`, sharded safetensors with
`model.safetensors.index.json`, or `pytorch_model.bin` (sharded or not; needs torch, read with
weights_only=True). Safetensors are read without torch. Orbax directories are the ones `save(format="orbax")`
writes: `config.json` (HF-style), `jaxspec.json`, `params/` (Orbax) and the tokenizer files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.checkpoint import hf_t5
from jaxspec.checkpoint.errors import CheckpointError
from jaxspec.checkpoint.safetensors_io import SafetensorsFile, save_file
from jaxspec.model import Model
from jaxspec.models.t5 import T5Config, param_shapes
from jaxspec.tokenizer import load_tokenizer

_T5_ARCHITECTURES = ("T5ForConditionalGeneration", "MT5ForConditionalGeneration", "T5Model", "MT5Model")
_MARKER = "jaxspec.json"
# Models the project ships, loadable by name (filled in as embedded checkpoints land).
_EMBEDDED_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "embedded")


def default_dtype():
  """float32 on CPU (bfloat16 matmuls are ~10x slower there), bfloat16 on TPU and GPU."""
  return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def embedded_names() -> list[str]:
  if not os.path.isdir(_EMBEDDED_DIR):
    return []
  return sorted(n for n in os.listdir(_EMBEDDED_DIR) if os.path.isdir(os.path.join(_EMBEDDED_DIR, n)))


def _resolve(path_or_name: str) -> tuple[str, str | None]:
  if os.path.isdir(path_or_name):
    return path_or_name, None
  if path_or_name in embedded_names():
    return os.path.join(_EMBEDDED_DIR, path_or_name), path_or_name
  if os.path.exists(path_or_name):
    raise CheckpointError(f"{path_or_name}: expected a model directory, got a file.")
  known = ", ".join(embedded_names()) or "none"
  raise CheckpointError(f"Unknown model {path_or_name!r}: not a directory and not an embedded model name "
                        f"(embedded models: {known}). Hub names cannot be downloaded here: pass the path of a "
                        f"downloaded Hugging Face directory.")


def _read_config(directory: str) -> T5Config:
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise CheckpointError(f"{directory}: no config.json: not a Hugging Face or jaxspec model directory.")
  try:
    with open(path) as f:
      raw = json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: cannot parse: {e}") from e
  archs = raw.get("architectures") or []
  model_type = raw.get("model_type")
  if model_type not in ("t5", "mt5") or (archs and not any(a in _T5_ARCHITECTURES for a in archs)):
    raise CheckpointError(f"{path}: unsupported architecture (model_type={model_type!r}, "
                          f"architectures={archs}); jaxspec loads T5 and mT5 encoder-decoders.")
  try:
    return T5Config.from_hf_dict(raw)
  except ValueError as e:
    raise CheckpointError(f"{path}: {e}") from e


class _TensorSource:
  """Name -> array over the weight files of one HF directory (single file or sharded with an index)."""

  def __init__(self, directory: str):
    self.directory = directory
    self._where: dict[str, tuple[str, object]] = {}
    for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model.bin")):
      index_path = os.path.join(directory, index_name)
      if os.path.exists(index_path):
        with open(index_path) as f:
          files = sorted(set(json.load(f)["weight_map"].values()))
        break
      if os.path.exists(os.path.join(directory, single)):
        files = [single]
        break
    else:
      raise CheckpointError(f"{directory}: no weights (model.safetensors, model.safetensors.index.json, "
                            f"pytorch_model.bin or pytorch_model.bin.index.json).")
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


def _untied_lm_head(source: _TensorSource) -> bool:
  """transformers unties lm_head exactly when the checkpoint holds an lm_head different from `shared`."""
  if "lm_head.weight" not in source.names():
    return False
  return not np.array_equal(source.get("lm_head.weight"), source.get("shared.weight"))


def _load_hf_params(directory: str, cfg: T5Config, dtype) -> tuple[T5Config, dict]:
  source = _TensorSource(directory)
  if "shared.weight" not in source.names():
    raise CheckpointError(f"{directory}: missing tensor 'shared.weight' (the token embedding).")
  cfg = dataclasses.replace(cfg, tie_word_embeddings=not _untied_lm_head(source))
  table = hf_t5.weight_table(cfg)
  shapes = param_shapes(cfg)
  expected = {row.hf_name for row in table}
  allowed_extra = set(hf_t5.TIED_COPIES) | set(hf_t5.IGNORED) | ({"lm_head.weight"} if cfg.tie_word_embeddings
                                                                 else set())
  unexpected = sorted(source.names() - expected - allowed_extra)
  if unexpected:
    raise CheckpointError(f"{directory}: tensors that this T5 config does not use (config.json and weights "
                          f"disagree?): {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''} in "
                          f"{source.file_of(unexpected[0])}.")
  params: dict = {}
  for row in table:
    if row.hf_name not in source.names():
      raise CheckpointError(f"{directory}: missing tensor {row.hf_name!r} (needed for {'/'.join(map(str, row.path))}).")
    want = hf_t5.get_path(shapes, row.path)
    got = source.shape(row.hf_name)
    hf_want = row.layout.to_hf(np.empty(want, np.uint8), cfg).shape
    if tuple(got) != tuple(hf_want):
      raise CheckpointError(f"{source.file_of(row.hf_name)}: tensor {row.hf_name!r} has shape {tuple(got)}, "
                            f"config.json implies {tuple(hf_want)}.")
    array = np.asarray(row.layout.to_ours(source.get(row.hf_name), cfg))
    hf_t5.set_path(params, row.path, jnp.asarray(array, dtype=dtype))
  return cfg, params


def _load_orbax_params(directory: str, cfg: T5Config, dtype) -> dict:
  import orbax.checkpoint as ocp
  target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtype), param_shapes(cfg),
                        is_leaf=lambda x: isinstance(x, tuple))
  path = os.path.abspath(os.path.join(directory, "params"))
  if not os.path.isdir(path):
    raise CheckpointError(f"{directory}: missing the Orbax parameter directory 'params/'.")
  try:
    return ocp.StandardCheckpointer().restore(path, target)
  except Exception as e:  # Orbax/TensorStore raise many types for missing or corrupt files.
    raise CheckpointError(f"{path}: cannot restore the Orbax checkpoint: {e}") from e


def load(path_or_name: str, dtype=None) -> Model:
  """Loads a T5 model: an HF directory, a jaxspec Orbax directory, or an embedded model name.

  Args:
    path_or_name: a directory, or an embedded model name (see `jaxspec.checkpoint.io.embedded_names()`).
    dtype: parameter dtype; None picks float32 on CPU and bfloat16 on accelerators.
  Returns:
    `jaxspec.Model` with `.config`, `.params` and `.tokenizer` (None when the directory has no tokenizer).
  Raises:
    CheckpointError (a ValueError) naming the file and tensor for missing, corrupt or mismatched files.
  """
  directory, name = _resolve(path_or_name)
  dtype = jnp.dtype(dtype or default_dtype())
  cfg = _read_config(directory)
  if os.path.exists(os.path.join(directory, _MARKER)):
    params = _load_orbax_params(directory, cfg, dtype)
  else:
    cfg, params = _load_hf_params(directory, cfg, dtype)
  return Model(config=cfg, params=params, tokenizer=load_tokenizer(directory), name=name or path_or_name)


def to_hf_state_dict(model: Model, dtype=None) -> dict[str, np.ndarray]:
  """HF-named numpy arrays for `model` (dtype None keeps the parameters' dtype)."""
  out = {}
  for row in hf_t5.weight_table(model.config):
    array = np.asarray(hf_t5.get_path(model.params, row.path))
    if dtype is not None:
      array = array.astype(dtype)
    out[row.hf_name] = np.ascontiguousarray(row.layout.to_hf(array, model.config))
  return out


def save(model: Model, directory: str, format: str = "orbax", dtype=None) -> None:  # pylint: disable=redefined-builtin
  """Writes `model` to `directory`.

  format="orbax": config.json + jaxspec.json + params/ (Orbax), restored by `jaxspec.load(directory)`.
  format="hf": config.json + model.safetensors that `T5ForConditionalGeneration.from_pretrained` loads.
  dtype: store the parameters in this dtype (e.g. jnp.bfloat16 to halve the size); None keeps theirs.
  The tokenizer, when the model has one, is saved beside the weights in both formats.
  """
  if format not in ("orbax", "hf"):
    raise ValueError(f"format must be 'orbax' or 'hf', got {format!r}.")
  if dtype is not None:
    model = dataclasses.replace(model, params=jax.tree.map(lambda x: x.astype(dtype), model.params))
  os.makedirs(directory, exist_ok=True)
  hf_config = model.config.to_hf_dict()
  hf_config["dtype"] = str(jnp.dtype(model.dtype))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  if format == "hf":
    save_file(to_hf_state_dict(model), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  else:
    import orbax.checkpoint as ocp
    path = os.path.abspath(os.path.join(directory, "params"))
    if os.path.exists(path):
      shutil.rmtree(path)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, model.params)
    checkpointer.wait_until_finished()
    with open(os.path.join(directory, _MARKER), "w") as f:
      json.dump({"format": "orbax", "version": 1}, f)
  if model.tokenizer is not None:
    model.tokenizer.save(directory)
