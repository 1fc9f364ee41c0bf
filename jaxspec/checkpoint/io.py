"""`jaxspec.load` and `jaxspec.save`: Hugging Face directories, Orbax checkpoints and embedded models, for every
registered model family (jaxspec/models/registry.py picks the family from `config.json`'s `model_type`), and
EAGLE-3 feature heads (config.json `architectures: ["LlamaForCausalLMEagle3"]`, told apart before the family
registry, which would read them as Llama models): `load` returns a `jaxspec.FeatureHead`, `save` writes the
reference's (SpecForge's) format back.

Orbax directories are the ones `save(format="orbax")` writes: `config.json` (HF-style), `jaxspec.json`,
`params/` (Orbax) and the tokenizer files. Saves are atomic: everything is written to a temporary sibling
directory that then replaces the target in one rename, so a failed or killed save leaves the previous checkpoint
as it was, and a directory never mixes files of two saves.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp

from jaxspec.sharding import param_shardings
from jaxspec.checkpoint import atomic, head_dir, hf_dir, hub
from jaxspec.errors import CheckpointError
from jaxspec.checkpoint.safetensors_io import save_file
from jaxspec.models.loaded import FeatureHead, Model
from jaxspec.models import registry
from jaxspec.models.eagle3.config import ARCHITECTURES as EAGLE3_ARCHITECTURES
from jaxspec.checkpoint.tokenizer import load_tokenizer

_MARKER = "jaxspec.json"
# Models the project ships, loadable by name.
_EMBEDDED_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "embedded")


def default_dtype():
  """float32 on CPU (bfloat16 matmuls are ~10x slower there), bfloat16 on TPU and GPU."""
  return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def embedded_names() -> list[str]:
  """Names of the embedded models (directories with a config.json under jaxspec/embedded/)."""
  if not os.path.isdir(_EMBEDDED_DIR):
    return []
  return sorted(n for n in os.listdir(_EMBEDDED_DIR)
                if os.path.isfile(os.path.join(_EMBEDDED_DIR, n, "config.json")))


def _resolve(path_or_name: str, revision: str | None = None,
             token: str | bool | None = None) -> tuple[str, str | None]:
  """(local directory, embedded or Hub name or None): a directory, an embedded name, then a Hub id."""
  if not isinstance(path_or_name, (str, os.PathLike)):
    raise CheckpointError(f"expected a model directory or name, got {type(path_or_name).__name__}.")
  path_or_name = os.fspath(path_or_name)
  if os.path.isdir(path_or_name):
    directory, name = path_or_name, None
  elif path_or_name in embedded_names():
    directory, name = os.path.join(_EMBEDDED_DIR, path_or_name), path_or_name
  elif os.path.exists(path_or_name):
    raise CheckpointError(f"{path_or_name}: expected a model directory, got a file.")
  elif hub.is_hub_name(path_or_name):
    try:
      return hub.resolve_model_dir(path_or_name, revision=revision, token=token), path_or_name
    except CheckpointError as e:
      if "/" in path_or_name:
        raise
      known = ", ".join(embedded_names()) or "none"  # A bare name is as likely a mistyped embedded name.
      raise CheckpointError(f"Unknown model {path_or_name!r}: not a directory, not an embedded model name "
                            f"(embedded models: {known}), and not found as a Hugging Face Hub id: {e}") from None
  else:
    known = ", ".join(embedded_names()) or "none"
    raise CheckpointError(f"Unknown model {path_or_name!r}: not a directory, an embedded model name (embedded "
                          f"models: {known}) or a Hugging Face Hub id ('org/name').")
  if revision is not None:
    raise CheckpointError(f"{path_or_name}: revision= applies to Hugging Face Hub ids, not to local directories "
                          f"or embedded models.")
  return directory, name


def _read_json(path: str):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: cannot parse: {e}") from e


def is_feature_head(directory: str) -> bool:
  """Whether a directory's config.json names an EAGLE-3 head architecture (a decoder-only or a T5 target's)."""
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    return False
  raw = _read_json(path)
  return isinstance(raw, dict) and bool(set(EAGLE3_ARCHITECTURES) & set(raw.get("architectures") or []))


def _load_head(directory: str, name: str, dtype, mesh, check_finite: bool = True) -> FeatureHead:
  if mesh is not None:
    raise CheckpointError(f"{directory}: an EAGLE-3 head is loaded on one device (mesh=None); generate replicates "
                          f"it beside a target placed on a mesh.")
  cfg, params = head_dir.load(directory, dtype, check_finite=check_finite)
  target = _read_json(os.path.join(directory, "config.json")).get(head_dir.TARGET_KEY)
  return FeatureHead(config=cfg, params=params, name=name, target=target if isinstance(target, dict) else None)


def read_config(directory: str) -> tuple[registry.Family, object]:
  """The family and config of a model directory (config.json, with generation_config.json's EOS ids)."""
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise CheckpointError(f"{directory}: no config.json: not a Hugging Face or jaxspec model directory.")
  raw = _read_json(path)
  if not isinstance(raw, dict):
    raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}.")
  try:
    family = registry.family_for_model_type(raw.get("model_type"))
  except registry.UnknownModelType as e:
    raise CheckpointError(f"{path}: unsupported architecture (model_type={raw.get('model_type')!r}, "
                          f"architectures={raw.get('architectures')}): {e}") from None
  generation_path = os.path.join(directory, "generation_config.json")
  if os.path.exists(generation_path):  # generation_config.json overrides config.json's EOS ids.
    generation = _read_json(generation_path)
    if isinstance(generation, dict) and generation.get("eos_token_id") is not None:
      raw = {**raw, "eos_token_id": generation["eos_token_id"]}
  try:
    return family, family.from_hf_config(raw)
  except (ValueError, TypeError, KeyError) as e:
    raise CheckpointError(f"{path}: invalid {family.name} config: {e}") from e


def _load_orbax_params(directory: str, family: registry.Family, cfg, dtype, mesh=None, rules=None) -> dict:
  """Restores params/; with a mesh, straight into sharded targets (each process restores its own shards)."""
  import orbax.checkpoint as ocp
  shapes = family.param_shapes(cfg)
  shardings = (jax.tree.map(lambda s: None, shapes, is_leaf=lambda x: isinstance(x, tuple)) if mesh is None
               else param_shardings(family, cfg, mesh, rules)[0])
  target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s, dtype, sharding=sh), shapes, shardings,
                        is_leaf=lambda x: isinstance(x, tuple))
  path = os.path.abspath(os.path.join(directory, "params"))
  if not os.path.isdir(path):
    raise CheckpointError(f"{directory}: missing the Orbax parameter directory 'params/'.")
  try:
    return ocp.StandardCheckpointer().restore(path, target)
  except Exception as e:  # Orbax/TensorStore raise many types for missing or corrupt files.
    raise CheckpointError(f"{path}: cannot restore the Orbax checkpoint: {e}") from e


def _check_dtype(dtype) -> jnp.dtype:
  try:
    dtype = jnp.dtype(dtype or default_dtype())
  except TypeError as e:
    raise CheckpointError(f"dtype {dtype!r} is not a dtype: {e}") from None
  if not jnp.issubdtype(dtype, jnp.floating):
    raise CheckpointError(f"dtype must be a floating-point type (float32, bfloat16, float16), got {dtype}.")
  return dtype


def load(path_or_name: str, dtype=None, mesh=None, rules=None, *, revision: str | None = None,
         token: str | bool | None = None, check_finite: bool = True) -> Model:
  """Loads a model of any registered family: an HF directory, a jaxspec Orbax directory, an embedded name, or a
  Hugging Face Hub id (downloaded into the Hugging Face cache: only the files jaxspec reads).

  Args:
    path_or_name: a directory, an embedded model name (see `jaxspec.checkpoint.embedded_names()`), or a Hub id
      such as "google/flan-t5-small" (HF_HOME / HF_HUB_CACHE choose the cache, HF_HUB_OFFLINE=1 never touches
      the network).
    revision: branch, tag or commit of a Hub model. token: for gated or private Hub models (default: HF_TOKEN or
      the stored login).
    dtype: parameter dtype (floating point); None picks float32 on CPU and bfloat16 on accelerators.
    mesh: a `jax.sharding.Mesh` (`jaxspec.make_mesh`): every parameter is placed with its NamedSharding as it is
      read, each process reading only its own devices' slices (safetensors) or shards (Orbax). None: one device.
    rules: logical-axis rules overriding `jaxspec.sharding.DEFAULT_RULES` (a dict, e.g. {"vocab": None}).
    check_finite: refuse HF tensors holding NaN or infinite values (one pass over the weights; False skips it
      for huge checkpoints).
  Returns:
    `jaxspec.Model` with `.config`, `.params` and `.tokenizer` (None when the directory has no tokenizer); for an
    EAGLE-3 head directory (architectures ["LlamaForCausalLMEagle3"]) a `jaxspec.FeatureHead`, to draft with as
    `jaxspec.Speculation(head, gamma=...)` for the target it was trained on.
  Raises:
    CheckpointError (a ValueError) naming the file and tensor for missing, corrupt or mismatched files.
  """
  directory, name = _resolve(path_or_name, revision, token)
  dtype = _check_dtype(dtype)
  if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
    raise CheckpointError(f"mesh must be a jax.sharding.Mesh (jaxspec.make_mesh(...)) or None, got "
                          f"{type(mesh).__name__} {mesh!r}.")
  if is_feature_head(directory):
    return _load_head(directory, name or path_or_name, dtype, mesh, check_finite)
  family, cfg = read_config(directory)
  if os.path.exists(os.path.join(directory, _MARKER)):
    params = _load_orbax_params(directory, family, cfg, dtype, mesh, rules)
  else:
    cfg, params = hf_dir.load_params(directory, family, cfg, dtype, check_finite=check_finite, mesh=mesh,
                                     rules=rules)
  try:
    tokenizer = load_tokenizer(directory)
  except Exception as e:  # transformers raises many types for corrupt tokenizer files.
    raise CheckpointError(f"{directory}: cannot read the tokenizer files (tokenizer.json, tokenizer_config.json, "
                          f"spiece.model, ...): {type(e).__name__}: {e}") from e
  return Model(config=cfg, params=params, tokenizer=tokenizer, name=name or path_or_name)


def to_hf_state_dict(model: Model, dtype=None):
  """HF-named numpy arrays for `model` (dtype None keeps the parameters' dtype)."""
  return hf_dir.to_hf_state_dict(model.family, model.config, model.params, dtype)


def _write(model: Model, directory: str, format: str) -> None:  # pylint: disable=redefined-builtin
  hf_config = model.config.to_hf_dict()
  hf_config["dtype"] = str(jnp.dtype(model.dtype))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  eos = list(model.config.eos_token_ids)
  with open(os.path.join(directory, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": eos[0] if len(eos) == 1 else eos, "pad_token_id": model.config.pad_token_id}, f,
              indent=2)
  if format == "hf":
    save_file(to_hf_state_dict(model), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  else:
    import orbax.checkpoint as ocp
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.abspath(os.path.join(directory, "params")), model.params)
    checkpointer.wait_until_finished()
    with open(os.path.join(directory, _MARKER), "w") as f:
      json.dump({"format": "orbax", "version": 1}, f)
  if model.tokenizer is not None:
    model.tokenizer.save(directory)


def save(model: Model, directory: str, format: str = "orbax", dtype=None) -> None:  # pylint: disable=redefined-builtin
  """Writes `model` to `directory`, atomically.

  format="orbax": config.json + jaxspec.json + params/ (Orbax), restored by `jaxspec.load(directory)`.
  format="hf": config.json + model.safetensors that transformers' `from_pretrained` loads.
  dtype: store the parameters in this dtype (e.g. jnp.bfloat16 to halve the size); None keeps theirs.
  The tokenizer, when the model has one, is saved beside the weights in both formats. An existing `directory`
  is replaced whole (never merged) when it holds only what jaxspec writes (configs, weights, tokenizer files, an
  Orbax params/); any other non-empty directory is refused with a CheckpointError listing the other entries, as
  are an empty path, the working directory, the home directory, their ancestors and a path under a file. A
  symlink is followed (its target is replaced, the link stays).
  A `jaxspec.FeatureHead` is always written in the reference's format (config.json + model.safetensors, which
  SpecForge and `jaxspec.load` read), whatever `format`; dtype converts its float weights (not d2t / t2d).
  """
  if isinstance(model, FeatureHead):
    params = model.params
    if dtype is not None:
      dtype = _check_dtype(dtype)
      params = {k: v if k in ("d2t", "t2d") else jax.tree.map(lambda x: x.astype(dtype), v) for k, v in params.items()}
    head_dir.save(directory, model.config, params, target=model.target)
    return
  if not isinstance(model, Model):
    raise CheckpointError(f"save expects a jaxspec.Model (from jaxspec.load, or jaxspec.Model(config, params, "
                          f"tokenizer)) or a jaxspec.FeatureHead, got {type(model).__name__}.")
  if format not in ("orbax", "hf"):
    raise CheckpointError(f"format must be 'orbax' or 'hf', got {format!r}.")
  directory = atomic.resolve_destination(directory, marker_files=("config.json",))
  if dtype is not None:
    dtype = _check_dtype(dtype)
    model = dataclasses.replace(model, params=jax.tree.map(lambda x: x.astype(dtype), model.params))
  with atomic.staging_dir(directory) as staging:
    _write(model, staging, format)
