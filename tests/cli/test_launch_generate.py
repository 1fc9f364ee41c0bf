"""launch/generate.py (issue 11 item 6): text in, text out for any loaded pair, one output line per prompt."""

import pytest

from script_helpers import assert_one_line_error, run_script, run_scripts, tiny_pair


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  target, draft = tiny_pair(str(tmp_path_factory.mktemp("models")))
  return [f"--target={target}", f"--draft={draft}", "--max_new_tokens=4"]


def test_stdin_prompts_give_one_line_each_and_the_speed_summary(models, tmp_path):
  out = tmp_path / "out.txt"
  res = run_script(["launch/generate.py", f"--output={out}", "--gamma=2", "--tree=2,3", "--batch_size=2"] + models,
                   stdin=b"The house is small.\n\nThank you.\n")  # a token tree; the resume below drafts chains
  assert res.returncode == 0, res.stderr[-3000:]
  lines = out.read_text(encoding="utf-8").split("\n")
  assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # three prompts, the empty one kept empty
  for key in ("alpha", "tokens per iteration", "speedup", "identical to plain greedy output: True"):
    assert key in res.stdout, key
  res = run_script(["launch/generate.py", f"--output={out}", "--gamma=2", "--batch_size=2"] + models,
                   stdin=b"The house is small.\n\nThank you.\nMore.\n")
  assert res.returncode == 0, res.stderr[-3000:]
  assert "resuming: 3 of 4" in res.stderr
  assert out.read_text(encoding="utf-8").split("\n")[:3] == lines[:3]


def test_chat_without_a_chat_template_is_one_line(models):
  res = run_script(["launch/generate.py", "--chat"] + models, stdin=b"Hello.\n")
  assert_one_line_error(res, "--chat", "chat template")


BAD_FLAGS = [
    (["--batch_size=0"], "--batch_size=0"), (["--top_p=1.5"], "--top_p"), (["--seed=-5"], "--seed=-5"),
    (["--input=/nonexistent.txt"], "/nonexistent.txt: no such file"), (["--tree=3"], "--tree=3"),
]


@pytest.fixture(scope="module")
def bad_flag_runs():
  """Every BAD_FLAGS case's run, as many at a time as there are CPUs."""
  return run_scripts([["launch/generate.py", "--target=no-such-model"] + args for args, _ in BAD_FLAGS])


@pytest.mark.parametrize("args, needle", BAD_FLAGS)
def test_bad_flags_and_inputs_end_in_one_line(args, needle, bad_flag_runs):
  assert_one_line_error(bad_flag_runs[BAD_FLAGS.index((args, needle))], needle)


def test_an_unknown_model_is_one_line():
  res = run_script(["launch/generate.py", "--target=no-such-model"], stdin=b"Hello.\n")
  assert_one_line_error(res, "Unknown model 'no-such-model'")


def test_a_feature_head_drafts_for_its_target(tmp_path):
  """`generate.py --target=DIR --draft=HEAD_DIR` with an EAGLE-3 head directory (the SpecForge format): greedy
  output identical to plain decoding (the script exits non-zero when they differ), on one device and with the
  target on a mesh (the head's weights replicated there); a head for another target is one line."""
  import jax
  from decoder_only_models import write_hf_decoder
  from jaxspec.checkpoint import head_dir
  from jaxspec.models import eagle3

  target = write_hf_decoder(str(tmp_path / "llama"), "llama2")
  cfg = eagle3.Eagle3Config(vocab_size=128, draft_vocab_size=64, hidden_size=32, target_hidden_size=32,
                            intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 0, 1))
  head_dir.save(str(tmp_path / "head"), cfg, eagle3.init_params(cfg, jax.random.key(0)))
  other = eagle3.Eagle3Config(**{**cfg.__dict__, "target_hidden_size": 48})
  head_dir.save(str(tmp_path / "other"), other, eagle3.init_params(other, jax.random.key(0)))
  run = ["launch/generate.py", f"--target={target}", f"--draft={tmp_path / 'head'}", "--gamma=3", "--max_new_tokens=6"]
  one, meshed, res = run_scripts([(run, b"hello world\nthe cat\n"), (run + ["--mesh=data:1,model:1"], b"the cat\n"),
                                  (["launch/generate.py", f"--target={target}", f"--draft={tmp_path / 'other'}"],
                                   b"hi\n")])
  for res_ok in (one, meshed):
    assert res_ok.returncode == 0, res_ok.stderr[-3000:]
    assert "identical to plain greedy output: True" in res_ok.stdout and "alpha" in res_ok.stdout
  assert_one_line_error(res, "target_hidden_size")
