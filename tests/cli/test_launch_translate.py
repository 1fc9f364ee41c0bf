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
from script_helpers import assert_one_line_error, run_forked, tiny_head, tiny_pair

@pytest.fixture(scope="module")
def models(tmp_path_factory):
  target, draft = tiny_pair(str(tmp_path_factory.mktemp("models")))
  return [f"--target={target}", f"--draft={draft}", "--max_new_tokens=4"]


def _lines(path) -> list[str]:
  text = path.read_text(encoding="utf-8")
  assert text.endswith("\n")
  return text[:-1].split("\n")


BAD_KNOBS = [
    ("--seed=-1", "--seed=-1"), (f"--seed={2**31}", f"--seed={2**31}"),  # item 8: outside [0, 2**31 - 1]
    ("--batch_size=0", "--batch_size=0"), ("--batch_size=-1", "--batch_size=-1"),  # item 10
    ("--top_p=0", "--top_p"), ("--temperature=-1", "--temperature"), ("--top_k=-3", "--top_k"),
    ("--gamma=0", "--gamma=0"), ("--max_new_tokens=0", "--max_new_tokens=0"), ("--mesh=data:x", "--mesh"),
]
FOUR = "The house is small.\nHello.\nGood morning.\nThank you.\n"
SAMPLE = ["--temperature=1.0", "--seed=11", "--nocompare", "--max_new_tokens=6"]  # the sampled runs' settings


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory):
  """Every launch/translate.py run of this module (`run_forked`), as many at a time as there are CPUs: first all
  those that need nothing, then the two that need a first output (the resume and the refused longer output).
  (directory, {name: CompletedProcess})."""
  d = tmp_path_factory.mktemp("translate")
  (d / "in.tsv").write_text("en\tde\nThe house is small.\t\nHello.\tHallo.\nGood morning.\nThank you.\tDanke.\n")
  (d / "en_only.tsv").write_text("en\n" + FOUR)  # no 'de' column at all
  (d / "five.txt").write_text(FOUR + "The dog is big.\n")
  (d / "latin1.txt").write_bytes("Good morning.\nGrüße aus Köln.\n".encode("latin-1"))
  (d / "headless.tsv").write_text("The house is small.\tDas Haus ist klein.\n")
  script = ["launch/translate.py"]
  first = {
      "tsv": script + [f"--input={d / 'in.tsv'}", f"--output={d / 'tsv.txt'}", "--nocompare"] + models,
      "en_only": script + [f"--input={d / 'en_only.tsv'}", f"--output={d / 'en_only.txt'}", "--nocompare"] + models,
      "sampled": script + [f"--input={d / 'five.txt'}", f"--output={d / 'sampled.txt'}", "--batch_size=1"]
                 + models + SAMPLE,
      "stdin": (script + ["--input=-", "--nocompare"] + models, b"Hello.\n\nThank you.\n"),
      "caches": (script + ["--input=-", "--nocompare"] + models + ["--max_new_tokens=1000000000"], b"Hello.\n"),
      "latin1": script + [f"--input={d / 'latin1.txt'}"] + models,
      "stdin_latin1": (script + ["--input=-"] + models, b"ok\n\xe4\n"),
      "headless": script + [f"--input={d / 'headless.tsv'}"] + models,
      "missing": script + [f"--input={d / 'missing.txt'}"] + models,
      **{flag: script + [flag, "--target=no-such-model"] for flag, _ in BAD_KNOBS},
  }
  res = dict(zip(first, run_forked(list(first.values()))))
  if res["sampled"].returncode == 0:
    done = _lines(d / "sampled.txt")
    # A run killed in the middle of line 3 (what it wrote first, the fingerprint: jaxspec.cli.resume), resumed
    # with another batch size; and an output longer than the input, with the same fingerprint.
    (d / "resumed.txt").write_text(done[0] + "\n" + done[1] + "\n" + "Das Ha")
    (d / "too_long.txt").write_text("a\nb\nc\nd\ne\nf\n")
    for name in ("resumed", "too_long"):
      shutil.copy(d / "sampled.txt.jaxspec.json", d / f"{name}.txt.jaxspec.json")
    second = {name: script + [f"--input={d / 'five.txt'}", f"--output={d / f'{name}.txt'}", "--batch_size=2"]
              + models + SAMPLE for name in ("resumed", "too_long")}
    res.update(zip(second, run_forked(list(second.values()))))
  return d, res


def test_every_tsv_row_gives_one_output_line(runs):
  """Item 1: rows whose German column is empty or missing were skipped (2 output lines for 4 rows)."""
  d, res = runs
  for name in ("tsv", "en_only"):
    assert res[name].returncode == 0, res[name].stderr[-3000:]
  lines = _lines(d / "tsv.txt")
  assert len(lines) == 4, lines
  # An English-only TSV (no 'de' column at all) gives the same lines: none skipped, none shifted.
  assert _lines(d / "en_only.txt") == lines


def test_resume_redoes_a_partial_last_line_and_refuses_a_longer_output(runs):
  """Item 5: a partial last line counted as done (the rest shifted); a longer output 'resumed' at 100 of 60.
  (The resumed output is the sampled run's of the next test, cut in the middle of its line 3.)"""
  d, res = runs
  assert res["sampled"].returncode == 0, res["sampled"].stderr[-3000:]
  assert res["resumed"].returncode == 0, res["resumed"].stderr[-3000:]
  assert "resuming: 2 of 5" in res["resumed"].stderr
  assert _lines(d / "resumed.txt") == _lines(d / "sampled.txt")
  assert_one_line_error(res["too_long"], "already has 6 lines, more than the 5 inputs")
  assert (d / "too_long.txt").read_text() == "a\nb\nc\nd\ne\nf\n"  # left as it was


def test_sampled_lines_do_not_depend_on_batch_size_or_resume_point(runs):
  """Item 8: one seed for every batch made a line's sample depend on the batch size and the resume point. Five
  lines sampled one per batch, then resumed after line 2 two per batch (lines 3 and 4 in one batch, line 5 with
  a padding row): each line as the first run sampled it."""
  d, res = runs
  assert res["sampled"].returncode == 0, res["sampled"].stderr[-3000:]
  assert res["resumed"].returncode == 0, res["resumed"].stderr[-3000:]
  sampled = _lines(d / "sampled.txt")
  assert len(sampled) == 5
  assert _lines(d / "resumed.txt") == sampled  # the batch size is not part of the fingerprint


@pytest.mark.parametrize("flag, needle", BAD_KNOBS)
def test_bad_knobs_stop_before_any_model_loads(flag, needle, runs):
  """Item 10: knob errors came as tracebacks after the models loaded; -1 rows exited 0 having written nothing."""
  res = runs[1][flag]
  assert_one_line_error(res, needle)
  assert "no-such-model" not in res.stderr  # the flags were checked first


def test_unreadable_inputs_are_named_with_their_line(runs):
  """Item 10: a non-UTF-8 file (UnicodeDecodeError, no line number), stdin, a TSV without its header."""
  d, res = runs
  for name, needle in (("latin1", f"{d / 'latin1.txt'}: line 2 is not valid UTF-8"),
                       ("stdin_latin1", "<stdin>: line 2 is not valid UTF-8"), ("headless", "no 'en' column"),
                       ("missing", "missing.txt: no such file")):
    assert_one_line_error(res[name], needle)


def test_stdin_lines_are_translated(runs):
  res = runs[1]["stdin"]
  assert res.returncode == 0, res.stderr[-3000:]
  assert res.stdout.count("  -> ") == 3 and "== summary" in res.stdout


def test_caches_too_large_end_with_one_line(runs):
  """A max_new_tokens whose caches cannot fit ended in a CacheTooLargeError traceback; now one line, exit 1."""
  assert_one_line_error(runs[1]["caches"], "GiB free")


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
