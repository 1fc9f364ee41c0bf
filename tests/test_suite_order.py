"""The suite's own order (issue 40 item 16): conftest.HEAVY_FILES go first, slowest first, and tests/README.md's
table of the slowest files lists the same files in the same order."""

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
  assert [f"tests/{name}" for name, _ in rows] == list(conftest.HEAVY_FILES)
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
