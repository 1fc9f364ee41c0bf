"""Checkpoint loading and saving (Hugging Face directories of every registered family, Orbax, embedded models)."""

from jaxspec.errors import CheckpointError
from jaxspec.checkpoint.io import embedded_names, load, save, to_hf_state_dict

__all__ = ["CheckpointError", "embedded_names", "load", "save", "to_hf_state_dict"]
