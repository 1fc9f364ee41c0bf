"""Every error jaxspec raises for a user's mistake or a broken input, under one base class.

`JaxspecError` is a ValueError, so `except ValueError` keeps working; launch scripts end any `JaxspecError` with one
line (`jaxspec.cli.flags.run`). Each subclass names where the problem is.
"""

from __future__ import annotations


class JaxspecError(ValueError):
  """Base of every error jaxspec raises for bad arguments, files, checkpoints or models."""


class SettingsError(JaxspecError):
  """A `Sampling`, `Speculation` or `generate` argument out of its range or of the wrong kind."""


class InputError(JaxspecError):
  """A user's input cannot be used as given (missing file, bad encoding, bad header, bad value)."""


class OutputError(InputError):
  """An output destination that cannot be written or resumed for this input."""


class ConfigError(InputError):
  """A training config that cannot be run as given."""


class CheckpointError(JaxspecError):
  """A checkpoint directory or file cannot be read as the expected model; the message names file and tensor."""


class UnknownModelType(JaxspecError):
  """A `model_type` (or config class) that no registered family handles."""


class NoChatTemplateError(JaxspecError):
  """`apply_chat_template` on a tokenizer that has none (T5, base models)."""


class CacheTooLargeError(JaxspecError):
  """The caches of a generate call would not fit in the device's free memory."""


class NonFiniteLogitsError(JaxspecError):
  """The target produced NaN or +inf logits for some rows (broken weights or inputs)."""


class CorpusError(JaxspecError):
  """A corpus cannot be built from the given inputs (too few pairs, a missing base file)."""
