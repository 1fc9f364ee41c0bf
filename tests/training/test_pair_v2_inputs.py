"""launch/train_pair_v2.py checks its corpus and clock before any model is built (issue 33, M9-M10 and the pair
pipeline's "Low" item): a missing split (named with --corpus, the pipeline's flag), a test split that is not
UTF-8, a training TSV without usable rows, a --deadline_s that leaves no time to distil: one line each, before
the target trains."""

import gzip
import os
import shutil

import pytest

from jaxspec.data.ende import read_pairs, write_pairs
from script_helpers import ROOT, assert_one_line_error, run_scripts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpora")
  sample = read_pairs(os.path.join(ROOT, "jaxspec", "embedded", "samples", "ende_sample.tsv"))
  good = root / "good"
  good.mkdir()
  write_pairs(str(good / "train.tsv.gz"), sample)
  for split in ("dev", "test", "dev_doc", "test_doc"):
    write_pairs(str(good / f"{split}.tsv"), sample[:6])
  corpora = {}
  for case in ("no_test", "latin1_test_doc", "empty_train"):
    corpora[case] = root / case
    shutil.copytree(good, corpora[case])
  os.remove(corpora["no_test"] / "test.tsv")
  with open(corpora["latin1_test_doc"] / "test_doc.tsv", "ab") as f:
    f.write("Gr\u00fc\u00dfe\tGr\u00fc\u00dfe\tdoc:x\n".encode("latin-1"))
  with gzip.open(corpora["empty_train"] / "train.tsv.gz", "wt", encoding="utf-8") as f:
    f.write("en\tde\tsource\nHello.\t\tding\n\tHallo.\tding\n")
  base = ["launch/train_pair_v2.py", f"--workdir={root / 'work'}", f"--out={root / 'out'}",
          "--draft_config.time_budget_s=4"]
  cases = {case: base + [f"--corpus={path}"] for case, path in corpora.items()}
  cases["deadline"] = base + [f"--corpus={good}", "--deadline_s=20"]
  cases["no_corpus"] = base + [f"--corpus={root / 'nowhere'}"]
  return dict(zip(cases, run_scripts(list(cases.values()), timeout=300)))


@pytest.mark.parametrize("case, needles", [
    ("no_test", ("test.tsv", "Pass --corpus")),
    ("latin1_test_doc", ("test_doc.tsv", "line 8", "UTF-8")),
    ("empty_train", ("train.tsv.gz holds no usable pair",)),
    ("deadline", ("--deadline_s=20 leaves no time", "--draft_config.time_budget_s=4")),
    ("no_corpus", ("--corpus=", "nowhere: not a directory")),
])
def test_bad_corpus_or_clock_is_one_line_before_training(runs, case, needles):
  res = runs[case]
  assert_one_line_error(res, *needles)
  assert "--data_dir" not in res.stderr
  assert "target" not in res.stdout  # no stage ran (each prints "[N s] stage: ...")
