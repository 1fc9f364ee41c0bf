"""T5 (1.0, 1.1, Flan-T5, mT5) as a registered family."""

from jaxspec.models.registry import Family
from jaxspec.models.t5 import weights
from jaxspec.models.t5.config import T5Config
from jaxspec.models.t5.model import T5Decoder, cache_axes, init_params, param_axes, param_shapes

FAMILY = Family(
    name="t5",
    model_types=("t5", "mt5"),
    config_class=T5Config,
    encoder_decoder=True,
    from_hf_config=T5Config.from_hf_dict,
    decoder=T5Decoder,
    init_params=init_params,
    param_shapes=param_shapes,
    param_axes=param_axes,
    cache_axes=cache_axes,
    weight_table=weights.weight_table,
    embedding_path=("shared", "embedding"),
    ignored_hf_names=weights.ignored_names,
    fit_to_checkpoint=weights.fit_to_checkpoint,
)
