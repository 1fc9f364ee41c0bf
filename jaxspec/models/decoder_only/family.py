"""`make_family`: the registry entry of a decoder-only family, from its config class (the rest is shared)."""

from __future__ import annotations

from jaxspec.models.decoder_only import model, weights
from jaxspec.models.registry import Family


def make_family(name: str, model_types: tuple[str, ...], config_class: type, **overrides) -> Family:
  """A `Family` whose configs are `config_class` (a DecoderOnlyConfig subclass with from_hf_dict / to_hf_dict).

  `overrides` replace shared fields (e.g. `weight_table=` for a family whose tensors are named differently).
  """
  fields = dict(
      name=name,
      model_types=model_types,
      config_class=config_class,
      encoder_decoder=False,
      from_hf_config=config_class.from_hf_dict,
      decoder=model.CausalDecoder,
      init_params=model.init_params,
      param_shapes=model.param_shapes,
      param_axes=model.param_axes,
      cache_axes=model.cache_axes,
      weight_table=weights.weight_table,
      embedding_path=("embedding",),
      ignored_hf_names=weights.ignored_names,
      fit_to_checkpoint=weights.fit_to_checkpoint,
  )
  fields.update(overrides)
  return Family(**fields)
