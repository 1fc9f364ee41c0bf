"""launch/translate.py fed bad and awkward input (issue 15 items 1, 5, 8 and 10): each test failed before the fix.

Tiny random models (the embedded tokenizer, 1-layer T5s) keep the runs short; what is checked is the shape of
the output (one line per input row, resumes, seeds) and the errors, not translation quality.
"""

import shutil

import numpy as np
import pytest

import jaxspec
from jaxspec.cli import jobs
from jaxspec.errors import CheckpointError
from script_helpers import assert_one_line_error, run_script, run_scripts, tiny_head, tiny_pair


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  target, draft = tiny_pair(str(tmp_path_factory.mktemp("models")))
  return [f"--target={target}", f"--draft={draft}", "--max_new_tokens=4"]


def _lines(path) -> list[str]:
  text = path.read_text(encoding="utf-8")
  assert text.endswith("\n")
  return text[:-1].split("\n")


def test_every_tsv_row_gives_one_output_line(models, tmp_path):
  """Item 1: rows whose German column is empty or missing were skipped (2 output lines for 4 rows)."""
  tsv = tmp_path / "in.tsv"
  tsv.write_text("en\tde\nThe house is small.\t\nHello.\tHallo.\nGood morning.\nThank you.\tDanke.\n")
  # An English-only TSV (no 'de' column at all) gives the same lines: none skipped, none shifted.
  en_only = tmp_path / "en_only.tsv"
  en_only.write_text("en\nThe house is small.\nHello.\nGood morning.\nThank you.\n")
  out = tmp_path / "out.txt"
  for res in run_scripts([["launch/translate.py", f"--input={tsv}", f"--output={out}", "--nocompare"] + models,
                          ["launch/translate.py", f"--input={en_only}", f"--output={tmp_path / 'en_only.txt'}",
                           "--nocompare"] + models]):
    assert res.returncode == 0, res.stderr[-3000:]
  lines = _lines(out)
  assert len(lines) == 4, lines
  assert _lines(tmp_path / "en_only.txt") == lines


def test_resume_redoes_a_partial_last_line_and_refuses_a_longer_output(models, tmp_path):
  """Item 5: a partial last line counted as done (the rest shifted); a longer output 'resumed' at 100 of 60."""
  inputs = tmp_path / "in.txt"
  inputs.write_text("The house is small.\nHello.\nGood morning.\nThank you.\n")
  full = tmp_path / "full.txt"
  res = run_script(["launch/translate.py", f"--input={inputs}", f"--output={full}", "--nocompare"] + models)
  assert res.returncode == 0, res.stderr[-3000:]
  expected = _lines(full)
  out = tmp_path / "out.txt"
  out.write_text(expected[0] + "\n" + expected[1] + "\n" + "Das Ha")  # killed in the middle of line 3
  shutil.copy(f"{full}.jaxspec.json", f"{out}.jaxspec.json")  # what the run wrote first (jaxspec.cli.resume)
  too_long = tmp_path / "too_long.txt"
  too_long.write_text("a\nb\nc\nd\ne\nf\n")
  shutil.copy(f"{full}.jaxspec.json", f"{too_long}.jaxspec.json")
  res, refused = run_scripts([["launch/translate.py", f"--input={inputs}", f"--output={out}", "--nocompare"] + models,
                              ["launch/translate.py", f"--input={inputs}", f"--output={too_long}"] + models])
  assert res.returncode == 0, res.stderr[-3000:]
  assert "resuming: 2 of 4" in res.stderr
  assert _lines(out) == expected
  assert_one_line_error(refused, "already has 6 lines, more than the 4 inputs")
  assert too_long.read_text() == "a\nb\nc\nd\ne\nf\n"  # left as it was


def test_sampled_lines_do_not_depend_on_batch_size_or_resume_point(models, tmp_path):
  """Item 8: one seed for every batch made a line's sample depend on the batch size and the resume point."""
  inputs = tmp_path / "in.txt"
  inputs.write_text("The house is small.\nHello.\nGood morning.\nThank you.\nThe dog is big.\n")
  sample = ["--temperature=1.0", "--seed=11", "--nocompare", "--max_new_tokens=6"]
  outs = {batch: tmp_path / f"b{batch}.txt" for batch in (1, 3)}
  for res in run_scripts([["launch/translate.py", f"--input={inputs}", f"--output={path}", f"--batch_size={batch}"]
                          + models + sample for batch, path in outs.items()]):
    assert res.returncode == 0, res.stderr[-3000:]
  assert _lines(outs[1]) == _lines(outs[3])
  resumed = tmp_path / "resumed.txt"
  resumed.write_text("\n".join(_lines(outs[1])[:2]) + "\n")
  shutil.copy(f"{outs[1]}.jaxspec.json", f"{resumed}.jaxspec.json")  # the batch size is not part of it
  res = run_script(["launch/translate.py", f"--input={inputs}", f"--output={resumed}", "--batch_size=2"]
                   + models + sample)
  assert res.returncode == 0, res.stderr[-3000:]
  assert _lines(resumed) == _lines(outs[1])


BAD_KNOBS = [
    ("--seed=-1", "--seed=-1"), (f"--seed={2**31}", f"--seed={2**31}"),  # item 8: outside [0, 2**31 - 1]
    ("--batch_size=0", "--batch_size=0"), ("--batch_size=-1", "--batch_size=-1"),  # item 10
    ("--top_p=0", "--top_p"), ("--temperature=-1", "--temperature"), ("--top_k=-3", "--top_k"),
    ("--gamma=0", "--gamma=0"), ("--max_new_tokens=0", "--max_new_tokens=0"), ("--mesh=data:x", "--mesh"),
]


@pytest.fixture(scope="module")
def bad_knob_runs():
  """Every BAD_KNOBS case's run, as many at a time as there are CPUs."""
  return run_scripts([["launch/translate.py", flag, "--target=no-such-model"] for flag, _ in BAD_KNOBS])


@pytest.mark.parametrize("flag, needle", BAD_KNOBS)
def test_bad_knobs_stop_before_any_model_loads(flag, needle, bad_knob_runs):
  """Item 10: knob errors came as tracebacks after the models loaded; -1 rows exited 0 having written nothing."""
  res = bad_knob_runs[BAD_KNOBS.index((flag, needle))]
  assert_one_line_error(res, needle)
  assert "no-such-model" not in res.stderr  # the flags were checked first


def test_unreadable_inputs_are_named_with_their_line(models, tmp_path):
  """Item 10: a non-UTF-8 file (UnicodeDecodeError, no line number), stdin, a TSV without its header."""
  latin = tmp_path / "latin1.txt"
  latin.write_bytes("Good morning.\nGrüße aus Köln.\n".encode("latin-1"))
  headless = tmp_path / "headless.tsv"
  headless.write_text("The house is small.\tDas Haus ist klein.\n")
  runs = run_scripts([["launch/translate.py", f"--input={latin}"] + models,
                      (["launch/translate.py", "--input=-"] + models, b"ok\n\xe4\n"),
                      ["launch/translate.py", f"--input={headless}"] + models,
                      ["launch/translate.py", f"--input={tmp_path / 'missing.txt'}"] + models])
  for res, needle in zip(runs, (f"{latin}: line 2 is not valid UTF-8", "<stdin>: line 2 is not valid UTF-8",
                                "no 'en' column", "missing.txt: no such file"), strict=True):
    assert_one_line_error(res, needle)


def test_stdin_lines_are_translated(models):
  res = run_script(["launch/translate.py", "--input=-", "--nocompare"] + models, stdin=b"Hello.\n\nThank you.\n")
  assert res.returncode == 0, res.stderr[-3000:]
  assert res.stdout.count("  -> ") == 3 and "== summary" in res.stdout


def test_caches_too_large_end_with_one_line(models):
  """A max_new_tokens whose caches cannot fit ended in a CacheTooLargeError traceback; now one line, exit 1."""
  res = run_script(["launch/translate.py", "--input=-", "--nocompare"] + models + ["--max_new_tokens=1000000000"],
                   stdin=b"Hello.\n")
  assert_one_line_error(res, "GiB free")


def test_a_feature_head_translates_as_plain_decoding(models, tmp_path, capsys):
  """Issue 21 item 6: `--draft=HEAD_DIR` as translate.py's main runs it (jobs.load_drafts, jobs.generate_texts; in
  process): translations identical to plain decoding's, the summary's c measured (not prompt lookup's 0); a head
  for another target is one CheckpointError naming the mismatch; with --tree=K,N the head drafts token trees, also
  identical to plain. (A head in the pool: tests/bench/test_tune.py.)"""
  target = jobs.load_target(models[0].removeprefix("--target="))
  head_dir = tiny_head(tmp_path / "head")
  head = jobs.load_drafts(head_dir, target)[head_dir]
  assert isinstance(head, jaxspec.FeatureHead)
  run = jobs.generate_texts(["The house is small.", "Hello.", "Good morning."], target,
                            jaxspec.Speculation(head, gamma=2), max_new_tokens=4)
  assert run.identical is True
  out = capsys.readouterr().out
  assert "identical to plain greedy output: True" in out and "c 0.000" not in out
  run = jobs.generate_texts(["The house is small.", "Hello."], target,  # --tree=2,3 with the head: token trees
                            jaxspec.Speculation(head, gamma=2, tree=jaxspec.Tree(2, 3)), max_new_tokens=4)
  assert run.identical is True
  with pytest.raises(CheckpointError, match="target_hidden_size"):
    jobs.load_drafts(tiny_head(tmp_path / "other", target_hidden_size=24), target)
  rand = jobs.load_drafts(f"random:{head_dir}", target)[f"random:{head_dir}"]  # its shapes, random weights
  assert isinstance(rand, jaxspec.FeatureHead) and rand.name == f"random:{head_dir}"
  np.testing.assert_array_equal(rand.params["d2t"], head.params["d2t"])  # the same draft vocabulary
  assert rand.params["fc"].shape == head.params["fc"].shape and not np.allclose(rand.params["fc"], head.params["fc"])
