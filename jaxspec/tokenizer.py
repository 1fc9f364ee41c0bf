"""`jaxspec.tokenizer`: the tokenizer interface and its reader, defined in jaxspec/checkpoint/tokenizer.py (reading
a model directory is the checkpoint layer's; docs/layers.md)."""

from jaxspec.checkpoint.tokenizer import (TOKENIZER_FILES, Tokenizer, load_tokenizer,
                                          write_sentencepiece_tokenizer)
from jaxspec.errors import NoChatTemplateError

__all__ = ["NoChatTemplateError", "TOKENIZER_FILES", "Tokenizer", "load_tokenizer", "write_sentencepiece_tokenizer"]
