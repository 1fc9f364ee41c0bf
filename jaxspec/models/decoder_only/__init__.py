"""Functional decoder-only transformers: Llama 2/3.x, Mistral, Qwen2/2.5/3, Gemma 2 and Gemma 3 (text).

One implementation (config.py, layers.py, model.py, weights.py) covers every family through the flags of
`DecoderOnlyConfig`; each family module (llama.py, qwen.py, gemma.py) only reads and writes its `config.json` and
registers itself. docs/families.md says what each family adds and how to add one.
"""

from jaxspec.models.decoder_only.config import FULL, SLIDING, DecoderOnlyConfig, Rope
from jaxspec.models.decoder_only.model import (CausalDecoder, DecoderOnlyCache, cache_axes, decode, forward,
                                               init_cache, init_params, param_axes, param_shapes, prefill)

__all__ = ["FULL", "SLIDING", "CausalDecoder", "DecoderOnlyCache", "DecoderOnlyConfig", "Rope", "cache_axes",
           "decode", "forward", "init_cache", "init_params", "param_axes", "param_shapes", "prefill"]
