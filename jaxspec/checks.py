"""The one check of an integer argument and the one check of a seed, used by every layer (settings, `generate`,
trees, the slot engine, batching, training configs, meshes, the memory planner, model configs). Like
`jaxspec.errors`, it sits below every layer (docs/layers.md): it imports nothing of jaxspec but the errors.

    check_int(value, "Speculation.gamma", 1, 256, note=" (draft tokens per iteration)")  # -> int(value)
    check_seed(value)                                                                      # -> int(value)

The message is one line, naming the argument, its range and the value given:
"Speculation.gamma must be an integer in [1, 256] (draft tokens per iteration), got 0."
"""

from __future__ import annotations

import numbers

import numpy as np

from jaxspec.errors import SettingsError

MAX_SEED = 2**31 - 1  # seeds are integers in [0, MAX_SEED]


def is_int(x) -> bool:
  """A Python or numpy integer, not a bool."""
  return isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_real(x) -> bool:
  """A Python or numpy real number, not a bool."""
  return isinstance(x, (numbers.Real, np.floating, np.integer)) and not isinstance(x, (bool, np.bool_))


def int_range(low: int | None, high: int | None) -> str:
  """' in [low, high]', ' >= low', ' <= high' or '': how a message states the range."""
  if low is not None and high is not None:
    return f" in [{low}, {high}]"
  return f" >= {low}" if low is not None else (f" <= {high}" if high is not None else "")


def check_int(value, name: str, low: int | None = None, high: int | None = None, *, note: str = "",
              error: type[Exception] = SettingsError) -> int:
  """`value` as an int when it is a Python or numpy integer (not a bool) in [low, high] (None: unbounded);
  otherwise `error` (SettingsError unless the caller's layer names another: InputError for a file's or a
  flag's value, ConfigError, CheckpointError, ValueError in models/) saying "{name} must be an integer{range}{note},
  got {value!r}."."""
  if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
    raise error(f"{name} must be an integer{int_range(low, high)}{note}, got {value!r}.")
  return int(value)


def check_seed(value, name: str = "seed", *, error: type[Exception] = SettingsError) -> int:
  """`value` as an int when it is a seed: an integer in [0, 2**31 - 1]; otherwise `error` saying
  "{name} must be an integer in [0, 2**31 - 1], got {value!r}."."""
  if not is_int(value) or not 0 <= value <= MAX_SEED:
    raise error(f"{name} must be an integer in [0, 2**31 - 1], got {value!r}.")
  return int(value)


__all__ = ["MAX_SEED", "check_int", "check_seed", "int_range", "is_int", "is_real"]
