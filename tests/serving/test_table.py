"""The slot engine's load table (`jaxspec.serving.SpeculationTable`) read from a file (issue 40 item 6): every entry
gets the checks the --gamma / --tree flags get, and a bad file is one error naming the file and the entry, before
any model loads (launch/serve.py --speculation_table)."""

import json

import pytest

import jaxspec
from jaxspec.errors import InputError, SettingsError
from jaxspec.serving import SpeculationTable, TableEntry
from jaxspec.serving.table import MAX_GAMMA
from script_helpers import assert_one_line_error, run_scripts

GOOD = {"entries": [{"max_active": 1, "gamma": 4, "tree": {"top_k": 2, "nodes": 4}},
                    {"max_active": 8, "gamma": 2, "tree": None}, {"max_active": 64, "gamma": 0}]}


def _entries(*rows) -> str:
  return json.dumps({"entries": [GOOD["entries"][0], *rows]})


# (the file's text, what the one error must say): entry 2 fails each time, entry 1 is good.
BAD = [
    (_entries({"max_active": 8, "gamma": 6, "tree": {"top_k": 2, "nodes": 4}}), "deeper than its 4 nodes"),
    (_entries({"max_active": 8, "gamma": 1, "tree": {"top_k": 2, "nodes": 9}}), "proposing at least 9"),
    (_entries({"max_active": 8, "gamma": 100000}), f"gamma must be an integer in [0, {MAX_GAMMA}]"),
    (_entries({"max_active": 8, "gamma": True}), "gamma must be an integer"),
    (_entries({"max_active": 8, "gamma": 2.0}), "gamma must be an integer"),
    (_entries({"max_active": 0, "gamma": 2}), "max_active must be an integer"),
    (_entries({"max_active": 8, "gama": 2}), "expected the fields max_active, gamma"),
    (_entries({"max_active": 8, "gamma": 2, "tree": {"top_k": 2}}), "tree must be null or"),
    (_entries({"max_active": 8, "gamma": 2, "tree": {"top_k": 0, "nodes": 4}}), "Tree.top_k"),
    (_entries([8, 2]), "expected an object"),
]


def test_a_good_table_reads_back():
  table = SpeculationTable.from_json(json.dumps(GOOD))
  assert table == SpeculationTable((TableEntry(1, 4, jaxspec.Tree(2, 4)), TableEntry(8, 2), TableEntry(64, 0)))
  assert SpeculationTable.from_json(table.to_json()) == table


@pytest.mark.parametrize("text, needle", BAD)
def test_every_entry_gets_the_flags_checks_and_is_named(text, needle, tmp_path):
  path = tmp_path / "table.json"
  path.write_text(text)
  with pytest.raises(SettingsError) as info:
    SpeculationTable.read(str(path))
  message = str(info.value)
  assert message.startswith(f"{path}: entry 2 ") and needle in message and "\n" not in message, message


def test_a_deep_tree_and_a_huge_gamma_fail_when_made():
  """As --tree=2,4 --gamma=6 fails at parsing: not at the engine's warm-up."""
  with pytest.raises(SettingsError, match="deeper than its 4 nodes"):
    TableEntry(8, gamma=6, tree=jaxspec.Tree(2, 4))
  with pytest.raises(SettingsError, match="gamma"):
    TableEntry(8, gamma=MAX_GAMMA + 1)


def test_unreadable_and_non_text_files_are_one_error(tmp_path):
  binary = tmp_path / "table.bin"
  binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
  with pytest.raises(InputError, match="not a text file"):
    SpeculationTable.read(str(binary), "--speculation_table=x")
  with pytest.raises(InputError, match="^--speculation_table=y: No such file"):
    SpeculationTable.read(str(tmp_path / "missing.json"), "--speculation_table=y")
  for text in ("", "[]", '{"entries": []}', '{"entries": 3}', "[" * 100000):
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(SettingsError, match="not a SpeculationTable's JSON"):
      SpeculationTable.read(str(tmp_path / "t.json"))


def test_serve_refuses_a_bad_table_in_one_line_before_loading(tmp_path):
  binary, deep = tmp_path / "table.bin", tmp_path / "deep.json"
  binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
  deep.write_text(BAD[0][0])
  runs = run_scripts([["launch/serve.py", "--target=no-such-model", f"--speculation_table={binary}"],
                      ["launch/serve.py", "--target=no-such-model", f"--speculation_table={deep}"]], timeout=300)
  assert_one_line_error(runs[0], f"--speculation_table={binary}: not a text file")
  assert_one_line_error(runs[1], f"--speculation_table={deep}: entry 2", "deeper than its 4 nodes")
  for res in runs:  # refused before the target is looked for
    assert "no-such-model" not in res.stderr
