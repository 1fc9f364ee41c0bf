"""jaxspec.checks: the one integer check and the one seed check (issue 30), and that the library's entry points
use them (one message, whichever entry point gets the bad value)."""

import numpy as np
import pytest

import jaxspec
from jaxspec import checks
from jaxspec.errors import CheckpointError, ConfigError, InputError, SettingsError


@pytest.mark.parametrize("value", [0, 7, np.int32(3), np.int64(2**40), -5])
def test_is_int_takes_python_and_numpy_integers(value):
  assert checks.is_int(value)


@pytest.mark.parametrize("value", [True, np.bool_(False), 1.0, "1", None, [1], np.float32(2)])
def test_is_int_refuses_bools_floats_and_the_rest(value):
  assert not checks.is_int(value)


def test_check_int_returns_a_python_int_and_names_the_range():
  assert checks.check_int(np.int64(5), "x", 1, 10) == 5 and type(checks.check_int(np.int64(5), "x")) is int
  for value, low, high, message in [(0, 1, 10, r"x must be an integer in \[1, 10\], got 0\."),
                                    (11, 1, 10, r"in \[1, 10\], got 11"), (-1, 0, None, r"x must be an integer >= 0,"),
                                    (5, None, 4, r"x must be an integer <= 4,"), (True, None, None,
                                                                                  r"x must be an integer, got True")]:
    with pytest.raises(SettingsError, match=message):
      checks.check_int(value, "x", low, high)
  with pytest.raises(SettingsError, match=r"gamma must be an integer >= 1 \(note\), got 2\.5\."):
    checks.check_int(2.5, "gamma", 1, note=" (note)")


@pytest.mark.parametrize("error", [InputError, ConfigError, CheckpointError, ValueError])
def test_check_int_raises_the_callers_error(error):
  with pytest.raises(error):
    checks.check_int("3", "x", error=error)


def test_check_seed_bounds():
  assert checks.check_seed(0) == 0 and checks.check_seed(checks.MAX_SEED) == 2**31 - 1
  for bad in (-1, 2**31, 1.5, None, True):
    with pytest.raises(SettingsError, match=r"^seed must be an integer in \[0, 2\*\*31 - 1\], got "):
      checks.check_seed(bad)
  with pytest.raises(InputError, match=r"^--seed must be"):
    checks.check_seed(-1, "--seed", error=InputError)


def test_every_entry_point_words_a_bad_seed_the_same():
  """generate's seed (decoding/arguments), batching's (a flag's), a training config's and the slot engine's request
  settings all go through check_seed: one message."""
  from jaxspec.decoding.arguments import seeds_for_rows
  from jaxspec.serving import RequestSettings
  from jaxspec.tools.batching import check_seed as batching_seed
  message = r"seed must be an integer in \[0, 2\*\*31 - 1\], got -1\."
  with pytest.raises(SettingsError, match=message):
    seeds_for_rows(-1, 2)
  with pytest.raises(InputError, match=message):
    batching_seed(-1)
  with pytest.raises(SettingsError, match=message):
    RequestSettings(max_tokens=4, seed=-1)


def test_integer_settings_word_their_range_the_same():
  with pytest.raises(SettingsError, match=r"^Tree.top_k must be an integer in \[1, 64\], got 0\.$"):
    jaxspec.Tree(top_k=0, nodes=4)
  with pytest.raises(SettingsError, match=r"^make_mesh: model must be an integer >= 1, got 0\.$"):
    jaxspec.make_mesh(model=0)
  with pytest.raises(ValueError, match=r"^memory_plan: gamma must be an integer >= 0, got -1\.$"):
    jaxspec.memory_plan("t5-small", (1, 1), 1, 16, 16, -1)
