"""launch/train.py fed changed data and bad configs (issue 15 item 6 and its siblings).

The token cache was keyed on the workdir only (a new --config.train trained on the old data) and a truncated one
failed with a raw JSONDecodeError forever; bad paths and config fields came as tracebacks.
"""

import json

import pytest

from jaxspec.data import token_cache
from jaxspec.data.ende import Pair, write_pairs
from script_helpers import EMBEDDED_TOKENIZER, assert_one_line_error, run_script, run_scripts

PAIRS = [("The house is small.", "Das Haus ist klein."), ("The dog is big.", "Der Hund ist groß."),
         ("Open the file.", "Öffnen Sie die Datei."), ("I like green tea.", "Ich mag grünen Tee.")]
TINY = ["--config.model.d_model=16", "--config.model.d_kv=4", "--config.model.d_ff=32", "--config.model.num_layers=1",
        "--config.model.num_decoder_layers=1", "--config.model.num_heads=2", "--config.tokens_per_batch=64",
        "--config.log_every=1", "--config.checkpoint_every=1", "--config.eval_every=1000",
        "--config.dev_loss_pairs=2", "--config.warmup_steps=1", f"--config.tokenizer={EMBEDDED_TOKENIZER}",
        # What these runs check is the token cache: one length bucket (one train program, not four) and no dev BLEU
        # (a greedy decode at the last step).
        "--config.max_len=32", "--config.length_buckets=32", "--config.dev_bleu_sentences=0"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  write_pairs(str(root / "a.tsv"), [Pair(en, de, "test") for en, de in PAIRS] * 3)  # 12 pairs
  write_pairs(str(root / "b.tsv"), [Pair(en, de, "test") for en, de in PAIRS[:2]] * 3)  # 6 pairs
  write_pairs(str(root / "dev.tsv"), [Pair(en, de, "test") for en, de in PAIRS[:2]])
  return root


def _train_args(workdir, train, data) -> list[str]:
  return ["launch/train.py", f"--workdir={workdir}", f"--config.train={train}", f"--config.dev={data / 'dev.tsv'}",
          "--config.train_steps=2"] + TINY


def _train(workdir, train, data):
  return run_script(_train_args(workdir, train, data))


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
  """The file's independent launch/train.py runs, forked together from one interpreter that imported JAX and
  jaxspec once (`run_scripts`): the token-cache test's first training run (its workdir: "cache_workdir"), every
  BAD_CONFIGS case ("bad0", ...) and the bad training files' runs. {name: CompletedProcess or path}."""
  root = tmp_path_factory.mktemp("runs")
  headless, empty = root / "train.tsv", root / "empty.tsv"
  headless.write_text("The house is small.\tDas Haus ist klein.\n")
  empty.write_text("en\tde\tsource\n\tDas Haus.\tx\n")  # a header, and a row without its 'en'
  named = {
      "first": _train_args(root / "cache", data / "a.tsv", data),
      "named": ["launch/train.py", f"--workdir={root / 'w'}", f"--config.train={headless}"],
      "empty_train": ["launch/train.py", f"--workdir={root / 'w2'}", f"--config.train={empty}",
                      f"--config.dev={data / 'dev.tsv'}"],
      "empty_dev": ["launch/train.py", f"--workdir={root / 'w3'}", f"--config.train={data / 'a.tsv'}",
                    f"--config.dev={empty}"],
      "no_workdir": ["launch/train.py"],
      **{f"bad{i}": ["launch/train.py", f"--workdir={root / f'bad{i}'}"] + args
         for i, (args, _) in enumerate(BAD_CONFIGS)}}
  return {**dict(zip(named, run_scripts(list(named.values())))), "cache_workdir": root / "cache",
          "headless": headless, "empty": empty}


def test_token_cache_follows_the_training_file_and_survives_truncation(data, runs):
  """Item 6: a new --config.train in the same workdir trained on the old data; a cut cache failed forever."""
  workdir, first = runs["cache_workdir"], runs["first"]
  assert first.returncode == 0, first.stderr[-3000:]
  assert "12 training pairs" in first.stdout and "step 2/2" in first.stdout
  second = _train(workdir, data / "b.tsv", data)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "6 training pairs" in second.stdout
  cache = workdir / "train_tokens.json"
  cache.write_text(cache.read_text()[:40])  # a write cut short (the old cache was written in place)
  third = _train(workdir, data / "b.tsv", data)
  assert third.returncode == 0, third.stderr[-3000:]
  assert "6 training pairs" in third.stdout and "cannot be read" in third.stderr
  assert len(json.loads(cache.read_text())["src"]) == 6


class _Tok:
  def __init__(self, fingerprint, offset):
    self.fingerprint, self.offset = fingerprint, offset
    self.hf_tokenizer = lambda texts: {"input_ids": [[len(t) + self.offset, 1] for t in texts]}


def test_token_cache_key_covers_tokenizer_size_and_mtime(data, tmp_path):
  train = tmp_path / "t.tsv"
  train.write_bytes((data / "a.tsv").read_bytes())
  cache = str(tmp_path / "cache.json")
  src, _ = token_cache.tokenized_pairs(str(train), _Tok("A", 0), cache)
  assert token_cache.tokenized_pairs(str(train), _Tok("A", 100), cache)[0] == src  # same key: from the cache
  other, _ = token_cache.tokenized_pairs(str(train), _Tok("B", 100), cache)  # another tokenizer: tokenized again
  assert other == [[s[0] + 100, 1] for s in src]
  write_pairs(str(train), [Pair("x", "y", "test")])
  assert token_cache.tokenized_pairs(str(train), _Tok("B", 0), cache)[0] == [[1, 1]]


BAD_CONFIGS = [
    (["--config.train=/nonexistent/train.tsv"], "/nonexistent/train.tsv: no such file"),
    (["--config.data_dir=/nonexistent"], "EN-DE train split not found: /nonexistent/train.tsv.gz"),
    (["--config.tokenizer=/nonexistent"], "config.tokenizer='/nonexistent'"),
    (["--config=configs/ende.py:draft_seqkd"], "config.train is not set"),
    (["--config.teacher=", "--config.distill_weight=0.5"], "needs config.teacher"),
    (["--config.no_such_field=1"], "--config.no_such_field: no such field"),
    (["--config.train_steps=many"], "--config.train_steps=many"),
]


@pytest.mark.parametrize("args, needle", BAD_CONFIGS)
def test_bad_configs_end_in_one_line(args, needle, runs):
  assert_one_line_error(runs[f"bad{BAD_CONFIGS.index((args, needle))}"], needle)


def test_a_training_tsv_without_its_header_or_rows_is_named(runs):
  """A TSV without its header; one with a header and no rows (issue 40 item 12: a raw IndexError from the
  tokenizer, then an abort), as training data or as the dev split; no --workdir. (The runs: `runs`.)"""
  headless, empty = runs["headless"], runs["empty"]
  named, empty_train, empty_dev, no_workdir = (runs[k] for k in ("named", "empty_train", "empty_dev", "no_workdir"))
  assert_one_line_error(named, f"{headless}: expected a header 'en<TAB>de")
  assert_one_line_error(empty_train, f"config.train={empty}", "holds no usable pair")
  assert_one_line_error(empty_dev, f"config.dev={empty}", "holds no usable pair")
  for res in (empty_train, empty_dev):
    assert "IndexError" not in res.stderr and "model " not in res.stdout  # before any model is built
  assert_one_line_error(no_workdir, "--workdir")
