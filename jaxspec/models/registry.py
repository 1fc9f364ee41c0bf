"""The family registry: a checkpoint's Hugging Face `model_type` -> everything jaxspec needs for that family.

A `Family` bundles its config class (read from and written to `config.json`), its `Decoder` adapter for the
decoding loop, its HF weight-name table with transform hooks, the logical axis names of its parameters and
caches (read by jaxspec.sharding), and its checkpoint conventions. Special-token conventions live in each
config: `eos_token_ids` (every id that ends a sequence; `generation_config.json` is merged in by the loader),
`pad_token_id`, and for decoder-only models `bos_token_id` (the tokenizer adds it when its config says so).

Adding a family: write its module (config + model + weight table + a `FAMILY = Family(...)`), then add one entry
to `_FAMILY_MODULES` below. docs/families.md walks through it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Iterable

import numpy as np

from jaxspec.models.contract import Decoder, ModelConfig
from jaxspec.models.hf_table import Row
from jaxspec.errors import UnknownModelType


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family behind the engine. Every callable takes the family's config."""

  name: str
  model_types: tuple[str, ...]  # Hugging Face `model_type` values this family reads.
  config_class: type
  encoder_decoder: bool  # True: inputs go to an encoder (T5); False: inputs are a prompt that is continued.
  from_hf_config: Callable[[dict], ModelConfig]  # config.json dict -> config (raises ValueError when invalid).
  decoder: Callable[[Any], Decoder]  # config -> the loop's adapter.
  init_params: Callable[..., dict]  # (config, key, dtype) -> random parameters.
  param_shapes: Callable[[Any], dict]  # config -> pytree of shape tuples (the structure of the parameters).
  param_axes: Callable[[Any], dict]  # config -> pytree of logical axis-name tuples.
  cache_axes: Callable[[Any], Any]  # config -> the cache's pytree with axis-name tuples as leaves.
  weight_table: Callable[[Any], list[Row]]  # config -> every HF tensor with our path and layout.
  embedding_path: tuple  # Path of the token embedding [V, D] in the parameters.
  # HF tensors a checkpoint may hold that are not read (tied copies, unused biases, rotary caches).
  ignored_hf_names: Callable[[Any], Iterable[str]] = lambda cfg: ()
  # (config, tensor names, get(name) -> array) -> the config that matches the checkpoint's weights (e.g. tying).
  fit_to_checkpoint: Callable[[Any, set, Callable[[str], np.ndarray]], Any] = lambda cfg, names, get: cfg


# One entry per family module; each module defines FAMILY. Imported lazily so that importing the registry does
# not import every family.
_FAMILY_MODULES = (
    "jaxspec.models.t5.family",
    "jaxspec.models.decoder_only.llama",
    "jaxspec.models.decoder_only.qwen",
    "jaxspec.models.decoder_only.gemma",
)


def families() -> list[Family]:
  return [importlib.import_module(m).FAMILY for m in _FAMILY_MODULES]


def model_types() -> list[str]:
  return sorted(t for f in families() for t in f.model_types)


def family_for_model_type(model_type: str | None) -> Family:
  for family in families():
    if model_type in family.model_types:
      return family
  raise UnknownModelType(f"unsupported model_type {model_type!r}: jaxspec runs {', '.join(model_types())}.")


def family_of(config: Any) -> Family:
  """The family of a config object (by its `model_type`; several families may share one config class)."""
  family = family_for_model_type(getattr(config, "model_type", None))
  if not isinstance(config, family.config_class):
    raise UnknownModelType(f"a {type(config).__name__} with model_type {config.model_type!r}: the {family.name} "
                           f"family expects a {family.config_class.__name__}.")
  return family
