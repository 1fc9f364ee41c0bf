"""train_head's run directory and settings are checked before the target loads or regenerates (issue 33, M5-M7
and train_head's "Low" items): --out empty or a file, a user's numeric folder under OUT/checkpoints, a user's
OUT/head, a batch larger than the prompts, an evaluation gamma or a seed out of range; a resume with another
draft vocabulary, a changed batch size and Orbax's log lines: test_train_head.py (they need a trained run)."""

from __future__ import annotations


import pytest

from jaxspec.errors import CheckpointError, ConfigError
from jaxspec.training import head
from jaxspec.training.head import train_head

import train_head_worker as tiny
from script_helpers import assert_one_line_error, run_scripts

PROMPTS = tiny.prompts(8, 0)


def test_run_directory_and_settings_are_checked_first(tmp_path):
  """`head.check_run`: what train_head (and launch/train_head.py, before loading the target) checks first."""
  a_file = tmp_path / "notes.txt"
  a_file.write_text("mine")
  user_step = tmp_path / "run_with_user_step"
  (user_step / "checkpoints" / "7").mkdir(parents=True)
  (user_step / "checkpoints" / "7" / "photo.jpg").write_text("mine")
  user_head = tmp_path / "run_with_user_head"
  (user_head / "head").mkdir(parents=True)
  (user_head / "head" / "draft.md").write_text("mine")
  cases = [
      ("", tiny.config(), ConfigError, "workdir is empty"),
      (str(a_file), tiny.config(), ConfigError, "notes.txt is a file, not a run directory"),
      (str(a_file / "run"), tiny.config(), ConfigError, "notes.txt is a file"),
      (str(user_step), tiny.config(), ConfigError, "checkpoints/7 is not a checkpoint this training wrote"),
      (str(user_head), tiny.config(), CheckpointError, "draft.md"),
      (str(tmp_path / "new"), tiny.config(batch_size=9), ConfigError, "batch_size=9 exceeds the 8 training rows"),
      (str(tmp_path / "new"), tiny.config(eval_gamma=300), ConfigError, "eval_gamma=300"),
      (str(tmp_path / "new"), tiny.config(seed=2**31), ConfigError,
       r"seed must be an integer in \[0, 2\*\*31 - 1\], got 2147483648"),
  ]
  for workdir, config, error, needle in cases:
    with pytest.raises(error, match=needle):
      head.check_run(workdir, config, len(PROMPTS))
  head.check_run(str(tmp_path / "new"), tiny.config(), len(PROMPTS))  # a fresh directory passes
  assert not (tmp_path / "new").exists()  # and is not made by the check
  with pytest.raises(ConfigError, match="checkpoints/7 is not a checkpoint"):  # the library checks it too
    train_head(tiny.tiny_target(), PROMPTS, str(user_step), tiny.config())


def test_launch_script_checks_out_and_batch_before_the_target(tmp_path):
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("1 2 3\n4 5 6\n7 8\n")
  a_file = tmp_path / "notes.txt"
  a_file.write_text("mine")
  base = ["launch/train_head.py", "--target=/nonexistent", f"--prompts={prompts}", "--heldout=1", "--batch_size=1"]
  empty, is_file, batch, seed = run_scripts([
      base + ["--out="], base + [f"--out={a_file}"], base + [f"--out={tmp_path / 'run'}", "--batch_size=3"],
      base + [f"--out={tmp_path / 'run'}", "--seed=2147483648"]], timeout=120)
  assert_one_line_error(empty, "--out")
  assert_one_line_error(is_file, "--out=", "notes.txt is a file")
  assert_one_line_error(batch, "--batch_size=3 exceeds the 2 training rows")
  assert_one_line_error(seed, "--seed")
  for res in (empty, is_file, batch, seed):
    assert "/nonexistent" not in res.stderr  # stopped before the target


def test_a_few_layer_target_gets_distinct_feature_layers():
  """Low: EAGLE-3's default (2, L // 2, L - 3) repeats a layer for L in 4..6 (L = 4: indices 2, 2, 1); a head
  trained by jaxspec then fuses low, middle and top features instead, recorded as aux ids; from L = 7 on, and at
  L = 3, the default stays (the reference's convention, no aux ids written)."""
  from jaxspec.models.decoder_only.llama import LlamaConfig
  for layers, want in ((3, (2, 1, 0)), (4, (1, 2, 4)), (5, (1, 3, 5)), (6, (1, 3, 6)), (7, (2, 3, 4)),
                       (32, (2, 16, 29))):
    head_cfg = head.head_config(LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=layers,
                                            num_heads=4, num_kv_heads=2, head_dim=8), 12)
    got = head_cfg.feature_layers(layers)
    assert got == want and len(set(got)) == 3, (layers, got)
    assert (head_cfg.aux_layer_ids is None) == (layers in (3, 7, 32))
