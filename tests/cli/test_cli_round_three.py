"""Launch scripts, round three (issue 33: M8 and the scripts' "Low" items): the benchmarks check --output_dir
before loading anything and no longer default to the committed docs/bench; a tree shape that --gamma does not
suit stops at parsing; generate.py's help offers no 'auto' it refuses; a refused --output keeps no lock file."""

import os

import pytest

from jaxspec.cli import resume
from jaxspec.errors import OutputError
from script_helpers import ROOT, assert_one_line_error, run_scripts

SETTINGS = dict(draft="ngram", gamma=3, temperature=0.0, top_k=0, top_p=1.0, seed=0, max_new_tokens=8,
                max_input_length=64, prefix="", chat=False)

CASES = {
    "benchmark_file": (["launch/benchmark.py", "--output_dir=/dev/null"],
                       ("--output_dir=/dev/null: is a file, expected a directory",)),
    "benchmark_empty": (["launch/benchmark.py", "--output_dir="], ("--output_dir is empty",)),
    "trees_file": (["launch/tree_benchmark.py", "--output_dir=/dev/null"],
                   ("--output_dir=/dev/null: is a file, expected a directory",)),
    "trees_deeper": (["launch/tree_benchmark.py", "--gamma=5", "--trees=2,3"],
                     ("--trees=2,3 with --gamma=5", "deeper than its 3 nodes")),
    "generate_deeper": (["launch/generate.py", "--gamma=4", "--tree=2,3"],
                        ("--tree=2,3 with --gamma=4", "deeper than its 3 nodes")),
    "translate_deeper": (["launch/translate.py", "--gamma=5", "--tree=1,3"], ("--tree=1,3 with --gamma=5",)),
}


@pytest.fixture(scope="module")
def runs():
  """Every CASES run (with a target that does not exist: a check that comes too late names it) and generate.py's
  --helpfull, as many at a time as there are CPUs."""
  args = [a + ["--target=no-such-model"] for a, _ in CASES.values()] + [["launch/generate.py", "--helpfull"]]
  results = run_scripts(args, timeout=300)
  return dict(zip(list(CASES) + ["generate_help"], results))


@pytest.mark.parametrize("case", list(CASES))
def test_bad_destinations_and_shapes_stop_before_loading(runs, case):
  res = runs[case]
  assert_one_line_error(res, *CASES[case][1])
  assert "no-such-model" not in res.stderr


def test_generate_help_offers_no_auto(runs):
  """generate.py refuses --gamma=auto and --tree=auto (translate.py's): its help does not offer them."""
  text = runs["generate_help"].stdout + runs["generate_help"].stderr
  for flag in ("  --gamma: ", "  --tree: "):
    entry = text[text.index(flag):].split("\n  --", 1)[0]
    assert "auto" not in entry, entry


def test_benchmarks_do_not_default_to_the_committed_results():
  for script in ("benchmark.py", "tree_benchmark.py", "tune.py"):
    with open(os.path.join(ROOT, "launch", script)) as f:
      source = f.read()
    default = source.split('"output_dir", ', 1)[1].split(",", 1)[0].strip('"')
    assert not default.startswith("docs"), (script, default)


def test_a_refused_output_keeps_no_lock_file(tmp_path):
  notes = tmp_path / "notes.txt"
  notes.write_text("my notes\n")
  record = resume.run_record(["a"], "in.txt", target=None, **SETTINGS)
  with pytest.raises(OutputError, match="not written by this script"):
    resume.open_output(str(notes), ["a"], record, input_spec="in.txt", main=True)
  assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
