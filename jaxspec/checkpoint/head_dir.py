"""EAGLE-3 head directories (SpecForge / SafeAILab format) read and written: config.json + model.safetensors (or
pytorch_model.bin). The tensors' names and layouts are `jaxspec.models.eagle3.weights`' (pure conversions); this
module does the file I/O.

    config, params = load(directory)            # config.json + model.safetensors (or pytorch_model.bin)
    save(directory, config, params)             # the same format back, atomically
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np

from jaxspec.checkpoint.atomic import check_replaceable, staging_dir
from jaxspec.checkpoint.hf_dir import TensorSource
from jaxspec.checkpoint.safetensors_io import save_file
from jaxspec.errors import CheckpointError
from jaxspec.models import eagle3
from jaxspec.models.eagle3 import weights
from jaxspec.models.eagle3.config import Eagle3Config

TARGET_KEY = weights.TARGET_KEY


def load(directory: str, dtype=jnp.float32, check_finite: bool = True) -> tuple[Eagle3Config, dict]:
  """Reads an EAGLE-3 head directory into (config, params); floats in `dtype`, d2t int32, t2d bool.

  Raises CheckpointError naming the file and tensor (or config.json and the field) for a missing, misshapen,
  truncated or unexpected tensor, a weight stored as integers or holding NaN or inf (unless check_finite=False),
  a d2t that is not integer or a t2d that is not bool, a missing or inconsistent d2t / t2d, or a config that is
  not an EAGLE-3 head or has a field missing or of the wrong type.
  """
  path = os.path.join(directory, "config.json")
  try:
    with open(path) as f:
      raw = json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: cannot read the head's config: {e}") from e
  try:
    cfg = Eagle3Config.from_hf_dict(raw)
  except CheckpointError as e:
    raise CheckpointError(f"{path}: {e}") from None
  source = TensorSource(directory)
  names = source.names()
  with_embedding = "embed_tokens.weight" in names
  shapes = eagle3.param_shapes(cfg, with_embedding)
  file_tensors = weights.file_tensors(cfg, with_embedding)
  missing = sorted(set(file_tensors) - names)
  for name in ("d2t", "t2d"):
    if name not in names:
      missing.append(name)
  if missing:
    raise CheckpointError(f"{directory}: EAGLE-3 head lacks tensors {missing}"
                          + (" (d2t / t2d map its draft vocabulary to the target's)" if {"d2t", "t2d"} & set(missing)
                             else "") + ".")
  unexpected = sorted(names - set(file_tensors) - {"d2t", "t2d"})
  if unexpected:
    raise CheckpointError(f"{directory}: unexpected tensors for an EAGLE-3 head with this config: {unexpected}.")
  params: dict = {}
  fc_norm_rows = {}
  for name, (dest, to_params) in file_tensors.items():
    want = (cfg.target_hidden_size,) if dest[0] == "fc_norm" else weights.get(shapes, dest)
    stored = source.dtype(name)
    if not np.issubdtype(stored, np.floating) and stored.name != "bfloat16":
      raise CheckpointError(f"{source.file_of(name)}: tensor {name!r} is stored as {stored}, not a floating-point "
                            f"type: not head weights (corrupt or wrong file).")
    raw_value = np.asarray(source.get(name))  # CheckpointError for a truncated file, naming it
    try:
      value = to_params(raw_value)
    except ValueError:  # A reshape of the wrong number of elements.
      value = None
    if value is None or value.shape != want:
      raise CheckpointError(f"{source.file_of(name)}: tensor {name!r} has shape {source.shape(name)}, which does "
                            f"not give {want} for this config.")
    if check_finite and not np.isfinite(value.astype(np.float32)).all():
      raise CheckpointError(f"{source.file_of(name)}: tensor {name!r} holds NaN or infinite values "
                            f"(load(..., check_finite=False) skips this check).")
    if dest[0] == "fc_norm":
      fc_norm_rows[dest[1]] = value
      continue
    weights.put(params, dest, jnp.asarray(value, dtype))
  if cfg.fc_norm:
    params["fc_norm"] = jnp.asarray(np.stack([fc_norm_rows[i] for i in range(cfg.num_features)]), dtype)
  for name, ok, kind in (("d2t", lambda t: np.issubdtype(t, np.integer), "an integer type"),
                         ("t2d", lambda t: t == np.bool_ or np.issubdtype(t, np.integer), "bool")):
    if not ok(source.dtype(name)):
      raise CheckpointError(f"{source.file_of(name)}: tensor {name!r} is stored as {source.dtype(name)}, not {kind} "
                            f"(the draft-to-target vocabulary map): corrupt or wrong file.")
  d2t, t2d = np.asarray(source.get("d2t")), np.asarray(source.get("t2d"))
  if np.issubdtype(t2d.dtype, np.integer) and not np.isin(t2d, (0, 1)).all():
    raise CheckpointError(f"{source.file_of('t2d')}: tensor 't2d' holds values other than 0 and 1: it must be a "
                          f"bool mask.")
  weights.check_vocab_map(d2t, t2d, cfg.vocab_size, cfg.draft_vocab_size, where=directory)
  params["d2t"], params["t2d"] = jnp.asarray(d2t, jnp.int32), jnp.asarray(t2d, jnp.bool_)
  return cfg, params



def save(directory: str, cfg: Eagle3Config, params: dict, target: dict | None = None) -> None:
  """Writes config.json and model.safetensors in the reference's format, atomically (the directory is replaced
  whole, or left as it was). target: the `target_signature` of the target it was trained on (config.json's
  jaxspec_target; readers of the reference ignore it)."""
  weights.check_vocab_map(params["d2t"], params["t2d"], cfg.vocab_size, cfg.draft_vocab_size)
  check_replaceable(directory, ("config.json",))
  tensors = weights.to_state_dict(cfg, params)
  with staging_dir(directory) as staging:
    with open(os.path.join(staging, "config.json"), "w") as f:
      json.dump({**cfg.to_hf_dict(), **({weights.TARGET_KEY: target} if target else {})}, f, indent=2)
    save_file(tensors, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
