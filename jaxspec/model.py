"""`jaxspec.Model` (a configuration, its parameters and optionally its tokenizer) and `jaxspec.FeatureHead` (an
EAGLE-3 head): defined in jaxspec/models/loaded.py, below the decoding and checkpoint layers that take and build them
(docs/layers.md)."""

from jaxspec.models.loaded import FeatureHead, Model

__all__ = ["FeatureHead", "Model"]
