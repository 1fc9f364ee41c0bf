"""jaxspec/training/ende_pair.py called as a library (what a notebook does): `check_inputs` takes the settings
and gives the script's one-line errors before any model is built (tests/training/test_pair_v2_inputs.py runs
them through launch/train_pair_v2.py)."""

import os
import types

import pytest

from jaxspec.data.ende import read_pairs, write_pairs
from jaxspec.errors import ConfigError, InputError
from jaxspec.training.ende_pair import PairSettings, check_inputs
from script_helpers import ROOT

TARGET = types.SimpleNamespace(dev="dev,dev_doc")  # the fields check_inputs reads of configs/ende.py's configs
DRAFT = types.SimpleNamespace(time_budget_s=4)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  sample = read_pairs(os.path.join(ROOT, "jaxspec", "embedded", "samples", "ende_sample.tsv"))
  write_pairs(str(root / "train.tsv.gz"), sample)
  for split in ("dev", "test", "dev_doc", "test_doc"):
    write_pairs(str(root / f"{split}.tsv"), sample[:6])
  return str(root)


def _settings(corpus, **kw):
  return PairSettings(corpus=corpus, target_config=TARGET, draft_config=DRAFT, **kw)


def test_good_inputs_pass(corpus):
  check_inputs(_settings(corpus, deadline_s=100, distill_s=10))


@pytest.mark.parametrize("change, error, needle", [
    (dict(corpus="/nowhere"), InputError, "--corpus=/nowhere: not a directory"),
    (dict(distill_s=0), ConfigError, "--distill_s=0: expected seconds > 0"),
    (dict(deadline_s=20), ConfigError, "--deadline_s=20 leaves no time"),
])
def test_bad_settings_name_the_flag(corpus, change, error, needle):
  with pytest.raises(error, match=needle):
    check_inputs(_settings(**{"corpus": corpus, **change}))


def test_out_defaults_to_the_workdir():
  assert _settings("c", workdir="w").out_dir == os.path.join("w", "out")
  assert _settings("c", workdir="w", out="o").out_dir == "o"
  assert _settings("c", workdir="w").model_dir("draft") == os.path.join("w", "draft", "export")
