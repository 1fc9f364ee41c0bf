"""Issue 24 ("Nothing lost, round two"), the launch scripts' part: outputs only resumed when a script wrote them
with the same input and settings, locked while written, checked writable before any model loads; plan.py's mesh
and numbers; one line instead of a traceback; small things (stdin on a terminal, --gamma=auto in generate.py, the
default draft, 'alpha n/a', batches no larger than the inputs, best_gamma's plain answer).

Library functions are called directly where the point is their behaviour; a launch script runs as a subprocess
(tiny models, CPU) only where the point is that it stops before loading a model, or prints one line.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys

import jax
import pytest

import jaxspec
from jaxspec.cli import jobs, resume
from jaxspec.tools import batching, inputs, outputs
from jaxspec.bench import report
from jaxspec.errors import InputError, OutputError
from jaxspec.models import t5
from jaxspec.tokenizer import load_tokenizer
from script_helpers import (EMBEDDED_TOKENIZER, assert_one_line_error, run_forked, run_script, run_scripts,
                            tiny_pair)

TEXTS = ["The house is small.", "", "Hello.", "Thank you."]
SETTINGS = dict(draft="ngram", gamma=3, temperature=0.0, top_k=0, top_p=1.0, seed=0, max_new_tokens=8,
                max_input_length=64, prefix="", chat=False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  return tiny_pair(str(tmp_path_factory.mktemp("pair")))


@pytest.fixture(scope="module")
def loaded(pair):
  return jaxspec.load(pair[0]), jaxspec.load(pair[1])


@pytest.fixture()
def model_dir(tmp_path):
  """A directory that model_fingerprint reads (nothing loads it)."""
  path = tmp_path / "model"
  path.mkdir()
  (path / "config.json").write_text('{"d_model": 16}')
  (path / "model.safetensors").write_bytes(b"weights")
  return str(path)


def _open(out, texts=TEXTS, target=None, input_spec="in.txt", allow=False, **changes):
  record = resume.run_record(texts, input_spec, target=target, **dict(SETTINGS, **changes))
  return resume.open_output(str(out), texts, record, input_spec=input_spec, allow_new_settings=allow, main=True)


def _write(out, n, **kw) -> int:
  """Opens out as a script would, appends n lines, ends the run; returns the resume point it found."""
  writer = _open(out, **kw)
  start = writer.done
  writer.write([f"out {i}" for i in range(start, start + n)])
  writer.lock.close()
  return start


# --- item 3: only files the scripts wrote are resumed -------------------------------------------------------------


def test_only_files_a_script_wrote_are_resumed(tmp_path, model_dir):
  """Item 3: a notes file lost its last line, --output=--input turned prompts into outputs, a plain *.gz lost all."""
  notes = tmp_path / "notes.txt"
  notes.write_text("my notes\nno final newline")
  with pytest.raises(OutputError, match="not written by this script"):
    _open(notes, target=model_dir)
  assert notes.read_text() == "my notes\nno final newline"  # untouched, last line included
  src = tmp_path / "in.txt"
  src.write_text("\n".join(TEXTS) + "\n")
  link = tmp_path / "link.txt"
  link.symlink_to(src)
  for out in (src, link):
    with pytest.raises(OutputError, match="is the --input file"):
      _open(out, target=model_dir, input_spec=str(src))
  assert src.read_text() == "\n".join(TEXTS) + "\n"
  plain = tmp_path / "plain.txt.gz"
  plain.write_text("plain text\nnamed gz\n")
  for make in (lambda: outputs.LineWriter(str(plain), 4), lambda: _open(plain, target=model_dir)):
    with pytest.raises(OutputError, match="not gzip|not written by this script"):
      make()
  assert plain.read_text() == "plain text\nnamed gz\n"
  # With its fingerprint, a plain-text *.gz is still refused, not truncated.
  (tmp_path / "plain.txt.gz.jaxspec.json").write_text(json.dumps(resume.run_record(TEXTS, "in.txt", target=model_dir,
                                                                                   **SETTINGS)))
  with pytest.raises(OutputError, match="not gzip"):
    _open(plain, target=model_dir)
  assert plain.read_text() == "plain text\nnamed gz\n"
  # What a script wrote resumes, gzipped or not; an empty file is a fresh output.
  for name in ("out.txt", "out.txt.gz", "empty.txt"):
    if name == "empty.txt":
      (tmp_path / name).write_text("")
    _write(tmp_path / name, 2, target=model_dir)
    assert _write(tmp_path / name, 2, target=model_dir) == 2
  assert gzip.open(tmp_path / "out.txt.gz", "rt").read() == "out 0\nout 1\nout 2\nout 3\n"


def test_generate_refuses_a_foreign_output_before_loading_models(tmp_path):
  """Item 3 in the scripts: the check runs before any model loads (an unknown --target is never reached)."""
  notes = tmp_path / "notes.txt"
  notes.write_text("keep me\nand me")
  src = tmp_path / "in.txt"
  src.write_text("Hello.\n")
  res, same = run_scripts([(["launch/generate.py", "--target=no-such-model", f"--output={notes}"], b"Hello.\n"),
                           ["launch/translate.py", "--target=no-such-model", f"--input={src}", f"--output={src}"]])
  assert_one_line_error(res, f"{notes} exists but was not written by this script")
  assert "no-such-model" not in res.stderr and notes.read_text() == "keep me\nand me"
  assert_one_line_error(same, "is the --input file")
  assert src.read_text() == "Hello.\n"


# --- item 4: a resume must match what produced the output ---------------------------------------------------------


def test_a_resume_refuses_another_input_model_or_setting(tmp_path, model_dir):
  """Item 4: a resume compared line counts only ('nothing to generate', exit 0, stale or shifted lines)."""
  out = tmp_path / "out.txt"
  _write(out, 2, target=model_dir)
  other = tmp_path / "other"
  other.mkdir()
  (other / "config.json").write_text('{"d_model": 32}')
  for kw, needle in ((dict(temperature=0.5, seed=0), "--temperature 0.0 -> 0.5"),
                     (dict(max_new_tokens=9), "--max_new_tokens 8 -> 9"),
                     (dict(prefix="p: "), "--prefix"), (dict(max_input_length=32), "--max_input_length"),
                     (dict(target=str(other)), f"--target {model_dir} -> {other}")):
    with pytest.raises(OutputError, match="written with other settings") as e:
      _open(out, **dict(dict(target=model_dir), **kw))
    assert needle in str(e.value), (needle, str(e.value))
  weights = os.path.join(model_dir, "model.safetensors")
  st = os.stat(weights)
  os.utime(weights, ns=(1, 1))  # the same directory, retrained
  with pytest.raises(OutputError, match="its files changed"):
    _open(out, target=model_dir)
  os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
  for texts, line in ((["The house is big."] + TEXTS[1:], 1), (["Inserted."] + TEXTS, 1), (TEXTS[:1] + ["x"], 2)):
    with pytest.raises(OutputError, match=f"input line {line} differs"):
      _open(out, texts=texts, target=model_dir)
  assert out.read_text() == "out 0\nout 1\n"  # every refusal left the output as it was
  # Appending lines and changing what never changes a line (batch size is not even recorded) resume.
  assert _write(out, 3, texts=TEXTS + ["More."], target=model_dir) == 2
  assert out.read_text().count("\n") == 5


def test_sampled_resumes_need_the_flag_for_another_draft_or_gamma(tmp_path, model_dir):
  """Item 4: greedy output is the target's whatever the draft and gamma; a sampled line depends on them, and on the
  seed, top_k and top_p (which greedy decoding ignores)."""
  greedy = tmp_path / "greedy.txt"
  _write(greedy, 1, target=model_dir)
  assert _write(greedy, 1, target=model_dir, draft="", gamma=5, seed=4, top_k=3) == 1
  assert _write(greedy, 1, target=model_dir, tree=jaxspec.Tree(2, 4)) == 2
  sampled = tmp_path / "sampled.txt"
  _write(sampled, 1, target=model_dir, temperature=0.7, seed=1)
  for kw in (dict(seed=2), dict(top_k=5), dict(top_p=0.5)):
    with pytest.raises(OutputError, match="written with other settings"):
      _open(sampled, target=model_dir, temperature=0.7, **dict(dict(seed=1), **kw))
  for kw in (dict(gamma=2), dict(draft="random:ende-draft"), dict(tree=jaxspec.Tree(2, 4))):
    with pytest.raises(OutputError, match="--resume_with_new_settings"):
      _open(sampled, target=model_dir, temperature=0.7, seed=1, **kw)
  assert _write(sampled, 1, target=model_dir, temperature=0.7, seed=1, gamma=2, allow=True) == 1
  with pytest.raises(OutputError, match="written with other settings"):  # the flag never covers the text's own
    _open(sampled, target=model_dir, temperature=0.7, seed=3, gamma=2, allow=True)


def test_generate_writes_the_fingerprint_and_refuses_a_changed_seed(pair, tmp_path):
  """Item 4 in a script: the sidecar exists after a run, and a sampled rerun with another --seed is refused."""
  out = tmp_path / "out.txt"
  args = ["launch/generate.py", f"--target={pair[0]}", f"--draft={pair[1]}", "--max_new_tokens=3", "--nocompare",
          f"--output={out}", "--temperature=1.0"]
  res = run_script(args + ["--seed=1"], stdin=b"Hello.\n")
  assert res.returncode == 0, res.stderr[-3000:]
  record = json.loads((tmp_path / "out.txt.jaxspec.json").read_text())
  assert record["settings"]["seed"] == 1 and record["input"]["lines"] == 1
  res = run_script(args + ["--seed=2"], stdin=b"Hello.\nMore.\n")
  assert_one_line_error(res, "--seed 1 -> 2")


# --- item 5: one run per output -----------------------------------------------------------------------------------


def test_a_second_run_on_the_same_output_is_refused(tmp_path, model_dir):
  """Item 5: two runs writing one --output interleaved their lines."""
  out = tmp_path / "out.txt"
  first = _open(out, target=model_dir)
  with pytest.raises(OutputError, match=f"{out}: another run holds it"):
    _open(out, target=model_dir)
  first.write(["a"])
  first.lock.close()  # the run ends
  assert _write(out, 1, target=model_dir) == 1


# --- item 11: writable destinations, checked first ----------------------------------------------------------------


def test_unwritable_destinations_are_refused(tmp_path):
  """Item 11: tune.py lost a whole run at its end, generate.py failed after its first batch."""
  a_file = tmp_path / "file.txt"
  a_file.write_text("x")
  for path, needle in ((str(tmp_path), "is a directory"), ("/dev/null", "not a regular file"),
                       (str(a_file / "out.txt"), "is a file, not a directory"), ("", "is empty"),
                       ("/proc/jaxspec_out.txt", "cannot write in /proc")):
    with pytest.raises(OutputError, match=needle):
      resume.check_output_file(path)
  resume.check_output_file(str(tmp_path / "new" / "dir" / "out.txt"))  # created when written
  for path, needle in ((str(a_file), "is a file, expected a directory"), ("", "is empty"),
                       (str(a_file / "sub"), "is a file, not a directory"), ("/proc/jaxspec_dir", "cannot write")):
    with pytest.raises(OutputError, match=needle):
      resume.check_output_dir(path, "--output_dir")
  resume.check_output_dir(str(tmp_path / "new_dir"))


DESTINATIONS = [
    (["launch/tune.py", "--output_dir=/dev/null"], "--output_dir=/dev/null: is a file, expected a directory"),
    (["launch/tune.py", "--output_dir="], "--output_dir is empty"),
    (["launch/generate.py", "--output=/dev/null"], "--output=/dev/null: is not a regular file"),
    (["launch/translate.py", "--output=/tmp"], "--output=/tmp: is a directory"),
]


@pytest.fixture(scope="module")
def destination_runs(refusals):
  """Every DESTINATIONS case's run (forked with the other refusals: `refusals`)."""
  return [refusals[("destination", i)] for i in range(len(DESTINATIONS))]


@pytest.mark.parametrize("args, needle", DESTINATIONS)
def test_scripts_check_destinations_before_loading(args, needle, destination_runs):
  res = destination_runs[DESTINATIONS.index((args, needle))]
  assert_one_line_error(res, needle)
  assert "no-such-model" not in res.stderr


def test_tune_refuses_zero_repeats(loaded):
  target, _ = loaded
  with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
    jaxspec.tune(target, {"ngram": jaxspec.NGramDraft()}, [[5, 6, 1]], repeats=0)


# --- item 12 and item 10 (part): plan.py, meshes, vocabularies ----------------------------------------------------


PLANS = [
    (["--mesh=data:4,model:8", "--device=tpu-v5e-8"], "32 devices, but --device=tpu-v5e-8 has 8"),
    (["--mesh=model:16", "--device=tpu-v4-8"], "16 devices, but --device=tpu-v4-8 has 4"),
    (["--device_gib=-1"], "--device_gib"), (["--device_gib=nan"], "--device_gib"),
    (["--device_gib=inf"], "--device_gib"), (["--batch=x"], "--batch"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
  """The module's one-line refusals, forked together from one interpreter (`run_scripts`: a run that stops on a
  bad flag then costs a fork, not an interpreter starting): every PLANS case's run (0, 1, ...), every
  DESTINATIONS case's (("destination", i)), and by name the tests' below (a broken checkpoint's directory,
  "broken"; "mesh", "gamma_auto", "tree_auto")."""
  broken = tmp_path_factory.mktemp("broken")
  (broken / "config.json").write_text("{not json")
  plan = ["launch/plan.py", "--model=t5-small", "--draft="]
  named = {**{i: (plan + args, None) for i, (args, _) in enumerate(PLANS)},
           **{("destination", i): (args + ["--target=no-such-model"], b"Hello.\n")
              for i, (args, _) in enumerate(DESTINATIONS)},
           "broken": (["launch/plan.py", f"--model={broken}", "--draft="], None),
           "mesh": (["launch/generate.py", "--mesh=data:3", "--target=no-such-model"], b"Hello.\n"),
           "gamma_auto": (["launch/generate.py", "--gamma=auto", "--target=no-such-model"], b"Hello.\n"),
           "tree_auto": (["launch/generate.py", "--tree=auto", "--target=no-such-model"], b"Hello.\n")}
  return dict(zip(named, run_scripts(list(named.values()))))


@pytest.mark.parametrize("args, needle", PLANS)
def test_plan_checks_the_mesh_and_numbers(args, needle, refusals):
  """Item 12: a 32-device mesh 'fit' an 8-chip machine; -1 or NaN GiB gave a verdict."""
  res = refusals[PLANS.index((args, needle))]
  assert_one_line_error(res, needle)
  assert "fits" not in res.stdout


def test_plan_on_a_broken_checkpoint_is_one_line(refusals):
  """Item 10: a --model directory with a broken config.json ended in a traceback. (The run: `refusals`.)"""
  assert_one_line_error(refusals["broken"], "config.json")


def test_a_mesh_larger_than_the_devices_is_one_line(refusals):
  """Item 10: --mesh=data:3 on one CPU device ended in make_mesh's traceback."""
  assert_one_line_error(refusals["mesh"], "--mesh=data:3", "does not divide the 1 devices")


def test_a_draft_of_a_smaller_vocabulary_is_refused_on_load(loaded, tmp_path):
  """Item 10: such a draft loaded, then generate raised a ValueError traceback in the first batch."""
  target, _ = loaded
  tok = load_tokenizer(EMBEDDED_TOKENIZER)
  cfg = t5.T5Config(vocab_size=tok.vocab_size - 100, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                    num_heads=2)
  small = str(tmp_path / "small")
  jaxspec.save(jaxspec.Model(cfg, t5.init_params(cfg, jax.random.key(3)), tok), small)
  with pytest.raises(InputError, match=f"--draft={small}: Draft and target vocabularies differ"):
    jobs.load_drafts(small, target)


# --- item 14 (part): small things ----------------------------------------------------------------------------------


def test_stdin_on_a_terminal_says_how_to_end(monkeypatch, capsys):
  """generate.py waited silently for prompts when started on a terminal without --input."""
  class Tty(io.TextIOWrapper):
    def isatty(self):
      return True
  monkeypatch.setattr(sys, "stdin", Tty(io.BytesIO(b"Hello.\n")))
  assert inputs.read_texts(inputs.STDIN) == ["Hello."]
  err = capsys.readouterr().err
  assert "one per line" in err and "Ctrl-D" in err


def test_generate_gamma_auto_is_refused_in_one_line(refusals):
  """--gamma=auto in generate.py: 'invalid literal for int()'; now it says where the measured choice is."""
  gamma, tree = refusals["gamma_auto"], refusals["tree_auto"]
  assert_one_line_error(gamma, "--gamma=auto", "translate.py")
  assert_one_line_error(tree, "--tree=auto", "translate.py")


def test_the_default_draft_is_dropped_for_another_family(tmp_path):
  """generate.py's default draft 'ende-draft' failed for a decoder-only target: now plain decoding, said so."""
  from decoder_only_models import write_hf_decoder  # pylint: disable=import-outside-toplevel
  target = str(tmp_path / "llama")
  write_hf_decoder(target, "llama2")
  res, named = run_forked([(["launch/generate.py", f"--target={target}", "--max_new_tokens=3"], b"hello\n"),
                           (["launch/generate.py", f"--target={target}", "--draft=ende-draft"], b"hello\n")])
  assert res.returncode == 0, res.stderr[-3000:]
  assert "decoding plainly" in res.stderr and "plain decoding:" in res.stdout
  assert_one_line_error(named, "tokenizer")  # named explicitly: still refused


def test_the_summary_says_n_a_when_nothing_was_verified(loaded):
  """'alpha nan' when every iteration rested (or prompt lookup matched nothing)."""
  target, draft = loaded
  resting = jaxspec.Speculation(draft, gamma=2, schedule="adaptive", fallback_alpha=1.0, prior_alpha=0.0,
                                probe_interval=1000)
  run = batching.generate_all(target, [[5, 6, 7, 1]], resting, max_new_tokens=4, bar=False)
  summary = "\n".join(report.speed_summary(run, target, resting, jaxspec.Sampling(), 1))
  assert "nan" not in summary and "alpha n/a" in summary


def test_a_batch_is_no_larger_than_the_inputs(loaded, monkeypatch):
  """--batch_size=8 on 2 inputs decoded 8 rows (6 copies of the last) per call."""
  target, draft = loaded
  rows = []
  generate = jaxspec.generate
  monkeypatch.setattr(jaxspec, "generate", lambda t, x, *a, **kw: rows.append(len(x)) or generate(t, x, *a, **kw))
  run = batching.generate_all(target, [[5, 6, 1], [7, 8, 9, 1]], jaxspec.Speculation(draft, gamma=2), batch_size=8,
                              max_new_tokens=3, bar=False)
  assert rows == [2, 2] and len(run.texts) == 2  # warm-up and timed call, two rows each
  rows.clear()
  batching.generate_all(target, [[5, 6, 1], [7, 8, 9, 1], [5, 1]], batch_size=8, max_new_tokens=3, bar=False,
                        start=2)
  assert rows == [1, 1]  # a resume decodes only what is left


def test_best_gamma_says_plain_when_no_gamma_wins():
  """best_gamma advised speculating (gamma 1) when every gamma is slower than plain decoding."""
  assert jaxspec.best_gamma(0.1, 0.5) == (0, 1.0)
  assert jaxspec.best_gamma(0.0, 0.0)[0] == 0  # a tie with plain decoding: plain
  assert jaxspec.best_gamma(0.75, 0.02)[0] >= 1
