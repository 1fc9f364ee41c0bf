"""Functional T5 (all public families: T5 1.0, T5 1.1, Flan-T5, mT5)."""

from jaxspec.models.t5.config import T5Config
from jaxspec.models.t5.model import (T5Cache, T5Decoder, cache_axes, decode, encode, forward, init_cache, init_params,
                                     param_axes, param_shapes)

__all__ = ["T5Config", "T5Cache", "T5Decoder", "cache_axes", "decode", "encode", "forward", "init_cache",
           "init_params", "param_axes", "param_shapes"]
