"""The other entry points fed bad input: benchmark, evaluate, distill_corpus, loop_profile, hardware_costs,
export_embedded, train_tokenizer and demo end with one line naming the problem; distill_corpus and evaluate run.
"""

import gzip

import pytest

from jaxspec.data.ende import Pair, read_pairs, write_pairs
from script_helpers import assert_one_line_error, run_script, run_scripts, tiny_pair

SENTENCES = [("The house is small.", "Das Haus ist klein."), ("The dog is big.", "Der Hund ist groß."),
             ("Open the file.", "Öffnen Sie die Datei."), ("I like green tea.", "Ich mag grünen Tee."),
             ("The cat sleeps.", "Die Katze schläft.")]


BAD_INPUT = [
    (["launch/benchmark.py", "--gammas=0"], "--gammas=0"),
    (["launch/benchmark.py", "--temperatures=0,hot"], "--temperatures=0,hot"),
    (["launch/benchmark.py", "--input=/nonexistent.txt"], "/nonexistent.txt: no such file"),
    (["launch/benchmark.py", "--data_dir=/nonexistent"], "EN-DE dev split not found: /nonexistent/dev.tsv"),
    (["launch/benchmark.py", "--paper=configs/paper_t5.py:ende_small_t0"], "--paper.checkpoint_dir"),
    (["launch/benchmark.py", "--paper=configs/paper_t5.py:ende_tiny_t0"], "unknown Table 2 row"),
    (["launch/evaluate.py", "--split=/nonexistent.tsv"], "/nonexistent.tsv: no such file"),
    (["launch/evaluate.py", "--data_dir=/nonexistent"], "EN-DE test split not found"),
    (["launch/evaluate.py", "--batch_size=0"], "--batch_size=0"),
    (["launch/distill_corpus.py"], "--output"),
    (["launch/distill_corpus.py", "--output=x.tsv.gz", "--max_pairs=0"], "--max_pairs=0"),
    (["launch/loop_profile.py", "--batch_size=0"], "--batch_size=0"),
    (["launch/loop_profile.py", "--gammas=-1"], "--gammas=-1"),
    (["launch/hardware_costs.py", "--drafts=t5-huge"], "--drafts"),
    (["launch/hardware_costs.py", "--repeats=0"], "--repeats=0"),
    (["launch/export_embedded.py", "--source=/x", "--name=../escape"], "--name"),
    (["launch/export_embedded.py", "--source=/nonexistent", "--name=mine"], "Unknown model '/nonexistent'"),
    (["launch/train_tokenizer.py", "--output_dir=/tmp/x", "--train=/nonexistent.tsv"], "/nonexistent.tsv"),
    (["launch/demo.py", "--config.gamma=0"], "gamma"),
    (["launch/demo.py", "--config.gama=2"], "--config.gama: no such field"),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  pairs = [Pair(en, de, "deb trans-de-en (ding)") for en, de in SENTENCES]
  write_pairs(str(root / "train.tsv.gz"), pairs)
  write_pairs(str(root / "test.tsv"), pairs[:4])
  target, draft = tiny_pair(str(root))
  return root, target, draft


def _distill_args(corpus, out) -> list[str]:
  root, target, _ = corpus
  return ["launch/distill_corpus.py", f"--target={target}", f"--data_dir={root}", f"--output={out}",
          "--batch_size=2", "--max_len=8"]


def _evaluate_args(corpus, out) -> list[str]:
  root, target, draft = corpus
  return ["launch/evaluate.py", f"--target={target}", f"--draft={draft}", f"--data_dir={root}", "--batch_size=2",
          "--max_new_tokens=4", f"--output={out}"]


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
  """The module's independent script runs, forked together from one interpreter (`run_scripts`): every BAD_INPUT
  case's (0, 1, ...), the first distill_corpus.py run ("distill"; its output: "distill_out") and the evaluate.py
  run ("evaluate"; "evaluate_out")."""
  out = tmp_path_factory.mktemp("runs")
  named = {**{i: args for i, (args, _) in enumerate(BAD_INPUT)},
           "distill": _distill_args(corpus, out / "distill.tsv.gz"),
           "evaluate": _evaluate_args(corpus, out / "eval.json")}
  return {**dict(zip(named, run_scripts(list(named.values())))), "distill_out": out / "distill.tsv.gz",
          "evaluate_out": out / "eval.json"}


@pytest.mark.parametrize("args, needle", BAD_INPUT)
def test_bad_input_ends_in_one_line(args, needle, runs):
  assert_one_line_error(runs[BAD_INPUT.index((args, needle))], needle)


def test_distill_corpus_resumes_after_a_cut_gzip_member(corpus, runs):
  out = runs["distill_out"]
  args = _distill_args(corpus, out)
  res = runs["distill"]  # the first run (`runs`); the resume below
  assert res.returncode == 0, res.stderr[-3000:]
  full = read_pairs(str(out))
  assert len(full) == 5 and {p.en for p in full} == {en for en, _ in SENTENCES}
  data = out.read_bytes()
  out.write_bytes(data[:len(data) - 30])  # a kill while the last batch's member was being written
  res = run_script(args)
  assert res.returncode == 0, res.stderr[-3000:]
  assert read_pairs(str(out)) == full
  assert gzip.open(out, "rt").read().count("en\tde\tsource") == 1


def test_evaluate_reports_bleu_alpha_and_identity(runs):
  out, res = runs["evaluate_out"], runs["evaluate"]
  assert res.returncode == 0, res.stderr[-3000:]
  assert "speculative output identical to the target's on 4/4 sentences" in res.stdout
  assert '"alpha"' in out.read_text() and '"bleu"' in out.read_text()
