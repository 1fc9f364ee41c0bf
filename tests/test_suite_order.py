"""The suite's own order (issue 40 item 16): conftest.HEAVY_FILES go first, slowest first, and tests/README.md's
table of the slowest files lists the first of them in the same order."""

import os
import re
import types

import conftest

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_heavy_files_exist_once_each_and_match_the_readme_table():
  assert len(set(conftest.HEAVY_FILES)) == len(conftest.HEAVY_FILES)
  for path in conftest.HEAVY_FILES:
    assert os.path.isfile(os.path.join(os.path.dirname(TESTS), path)), path
  with open(os.path.join(TESTS, "README.md"), encoding="utf-8") as f:
    rows = re.findall(r"^\| `([^`]+)` \| (\d+)\*? \|", f.read(), re.M)
  assert len(rows) >= 10 and [f"tests/{name}" for name, _ in rows] == list(conftest.HEAVY_FILES[:len(rows)])
  seconds = [int(s) for _, s in rows]
  assert seconds == sorted(seconds, reverse=True), seconds  # slowest first


def test_heavy_files_go_first_and_the_rest_keep_their_order():
  heavy = conftest.HEAVY_FILES
  ids = ["tests/a/test_x.py::t1", f"{heavy[1]}::t1", "tests/test_y.py::t1", f"{heavy[0]}::t2", f"{heavy[1]}::t2",
         "tests/a/test_x.py::t2", f"{heavy[0]}::t1"]
  items = [types.SimpleNamespace(nodeid=i) for i in ids]
  conftest.pytest_collection_modifyitems(items)
  assert [i.nodeid for i in items] == [f"{heavy[0]}::t2", f"{heavy[0]}::t1", f"{heavy[1]}::t1", f"{heavy[1]}::t2",
                                       "tests/a/test_x.py::t1", "tests/test_y.py::t1", "tests/a/test_x.py::t2"]


def test_the_compile_report_sums_each_files_tests(tmp_path):
  """compile_report's table: workers' tests summed per file, slowest file first, and a total row."""
  import json  # pylint: disable=import-outside-toplevel
  import compile_report  # pylint: disable=import-outside-toplevel
  compile_, hit = compile_report.COLUMNS["compile s"], compile_report.COLUMNS["cache hits"]
  (tmp_path / "gw0.json").write_text(json.dumps({"tests/a.py::t1": {"wall": 3.0, compile_: 2.0, hit: 1},
                                                 "tests/b.py::t1": {"wall": 1.0}}))
  (tmp_path / "gw1.json").write_text(json.dumps({"tests/b.py::t2": {"wall": 4.0, compile_: 1.5, hit: 2}}))
  lines = compile_report.table(str(tmp_path)).splitlines()
  assert lines[2] == "| tests/b.py | 5 | 2 | 0 | 0 | 2 | 0 |"
  assert lines[3] == "| tests/a.py | 3 | 2 | 0 | 0 | 1 | 0 |"
  assert lines[4] == "| total | 8 | 4 | 0 | 0 | 3 | 0 |"
