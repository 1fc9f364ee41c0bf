"""launch/generate.py (issue 11 item 6): text in, text out for any loaded pair, one output line per prompt.

The file's independent runs (the first stdin run, the feature-head runs and every one-line error) are forked at
once from one interpreter that imported JAX and jaxspec once (`run_scripts` of them all, `runs`); only the resume,
which reads the first run's output, runs after them."""

import pytest

from script_helpers import assert_one_line_error, run_script, run_scripts, tiny_pair

BAD_FLAGS = [
    (["--batch_size=0"], "--batch_size=0"), (["--top_p=1.5"], "--top_p"), (["--seed=-5"], "--seed=-5"),
    (["--input=/nonexistent.txt"], "/nonexistent.txt: no such file"), (["--tree=3"], "--tree=3"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  target, draft = tiny_pair(str(tmp_path_factory.mktemp("models")))
  return [f"--target={target}", f"--draft={draft}", "--max_new_tokens=4"]


def _head_dirs(root) -> str:
  """A tiny HF Llama target (returned) and two EAGLE-3 head directories under root (SpecForge's format): 'head'
  for it, and 'other' for a target 48 wide."""
  import jax
  from decoder_only_models import write_hf_decoder
  from jaxspec.checkpoint import head_dir
  from jaxspec.models import eagle3

  target = write_hf_decoder(str(root / "llama"), "llama2")
  cfg = eagle3.Eagle3Config(vocab_size=128, draft_vocab_size=64, hidden_size=32, target_hidden_size=32,
                            intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 0, 1))
  head_dir.save(str(root / "head"), cfg, eagle3.init_params(cfg, jax.random.key(0)))
  other = eagle3.Eagle3Config(**{**cfg.__dict__, "target_hidden_size": 48})
  head_dir.save(str(root / "other"), other, eagle3.init_params(other, jax.random.key(0)))
  return target


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory):
  """{name: CompletedProcess} of every independent run below, forked together; "stdin_output": the first stdin
  run's --output file (its resume runs in the test)."""
  root = tmp_path_factory.mktemp("runs")
  out = root / "out.txt"
  target = _head_dirs(root)
  head = ["launch/generate.py", f"--target={target}", f"--draft={root / 'head'}", "--gamma=3", "--max_new_tokens=6"]
  named = {
      # A token tree; the resume in the test drafts chains.
      "stdin": (["launch/generate.py", f"--output={out}", "--gamma=2", "--tree=2,3", "--batch_size=2"] + models,
                b"The house is small.\n\nThank you.\n"),
      "head_one": (head, b"hello world\nthe cat\n"),
      "head_meshed": (head + ["--mesh=data:1,model:1"], b"the cat\n"),
      "head_other": (["launch/generate.py", f"--target={target}", f"--draft={root / 'other'}"], b"hi\n"),
      "chat": (["launch/generate.py", "--chat"] + models, b"Hello.\n"),
      "unknown": (["launch/generate.py", "--target=no-such-model"], b"Hello.\n"),
      **{f"bad{i}": (["launch/generate.py", "--target=no-such-model"] + args, None)
         for i, (args, _) in enumerate(BAD_FLAGS)}}
  return {**dict(zip(named, run_scripts(list(named.values())))), "stdin_output": out}


def test_stdin_prompts_give_one_line_each_and_the_speed_summary(models, runs):
  out, res = runs["stdin_output"], runs["stdin"]
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


def test_chat_without_a_chat_template_is_one_line(runs):
  assert_one_line_error(runs["chat"], "--chat", "chat template")


@pytest.mark.parametrize("args, needle", BAD_FLAGS)
def test_bad_flags_and_inputs_end_in_one_line(args, needle, runs):
  assert_one_line_error(runs[f"bad{BAD_FLAGS.index((args, needle))}"], needle)


def test_an_unknown_model_is_one_line(runs):
  assert_one_line_error(runs["unknown"], "Unknown model 'no-such-model'")


def test_a_feature_head_drafts_for_its_target(runs):
  """`generate.py --target=DIR --draft=HEAD_DIR` with an EAGLE-3 head directory (the SpecForge format): greedy
  output identical to plain decoding (the script exits non-zero when they differ), on one device and with the
  target on a mesh (the head's weights replicated there); a head for another target is one line."""
  for res_ok in (runs["head_one"], runs["head_meshed"]):
    assert res_ok.returncode == 0, res_ok.stderr[-3000:]
    assert "identical to plain greedy output: True" in res_ok.stdout and "alpha" in res_ok.stdout
  assert_one_line_error(runs["head_other"], "target_hidden_size")
