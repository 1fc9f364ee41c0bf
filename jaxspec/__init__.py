"""jaxspec: exact speculative decoding for T5 in JAX."""

from jaxspec.checkpoint import CheckpointError, load, save
from jaxspec.model import Model
from jaxspec.models.t5 import T5Config

__all__ = ["CheckpointError", "Model", "T5Config", "load", "save"]
