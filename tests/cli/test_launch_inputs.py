"""The library under the launch scripts: reading inputs, resumable outputs, batched generation, flags, tables."""

import gzip
import os

import pytest

import jaxspec
from jaxspec.cli import flags as cli_flags
from jaxspec.tools import batching, inputs, outputs
from jaxspec.bench import report

from script_helpers import tiny_pair

def test_every_line_is_one_item(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(b"\xef\xbb\xbfone\r\n\ntwo\nthree")  # BOM, CRLF, an empty line, no final newline
  assert inputs.read_lines(str(path)) == ["one", "", "two", "three"]
  path.write_bytes(b"one\n\n")  # the final newline ends a line, the empty line before it is an item
  assert inputs.read_lines(str(path)) == ["one", ""]
  path.write_bytes(b"")
  assert inputs.read_lines(str(path)) == []


def test_tsv_rows_are_items_whatever_their_other_columns(tmp_path):
  path = tmp_path / "in.tsv.gz"
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("de\ten\nHallo.\tHello.\n\tOnly English.\nNur Deutsch.\n\n")
  assert inputs.read_texts(str(path)) == ["Hello.", "Only English.", "", ""]
  (tmp_path / "nohead.tsv").write_text("Hello.\tHallo.\n")
  with pytest.raises(inputs.InputError, match="no 'en' column"):
    inputs.read_texts(str(tmp_path / "nohead.tsv"))


def test_read_errors_name_the_file_and_line(tmp_path):
  path = tmp_path / "latin1.txt"
  path.write_bytes("ok\nGrüße\n".encode("latin-1"))
  with pytest.raises(inputs.InputError, match=r"latin1.txt: line 2 is not valid UTF-8"):
    inputs.read_lines(str(path))
  with pytest.raises(inputs.InputError, match="no such file"):
    inputs.read_lines(str(tmp_path / "missing.txt"))
  (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"a\nb\n")[:-6])
  with pytest.raises(inputs.InputError, match="cannot be read"):
    inputs.read_lines(str(tmp_path / "cut.txt.gz"))
  with pytest.raises(inputs.InputError, match="line 2 is not space-separated token ids"):
    inputs.parse_token_ids(["5 6", "5 x"], eos_id=1)


class _StubTokenizer:
  eos_id = 1

  def encode(self, text):
    return [10 + len(w) for w in text.split()] + [self.eos_id]

  def apply_chat_template(self, text):
    return f"<user> {text} <assistant>"


def test_encode_texts_prefix_chat_truncation_and_empty_items():
  tok = _StubTokenizer()
  ids = inputs.encode_texts(tok, ["a bb", "", "x"], prefix="p: ", chat=True, max_input_length=16)
  assert ids == [[16, 12, 11, 12, 21, 1], [], [16, 12, 11, 21, 1]]
  long = " ".join(["w"] * 10)
  assert inputs.encode_texts(tok, [long], max_input_length=4) == [[11, 11, 11, 1]]  # head and EOS kept
  with pytest.raises(inputs.InputError, match="line 1 has 11 tokens, more than --max_input_length=4"):
    inputs.encode_texts(tok, [long], max_input_length=4, long_inputs="refuse")

  class NoEos(_StubTokenizer):
    def encode(self, text):
      return [2] + [10 + i for i in range(len(text.split()))]  # BOS first, no EOS: a decoder-only prompt
  assert inputs.encode_texts(NoEos(), [long], max_input_length=4) == [[2, 17, 18, 19]]  # BOS and the tail kept

  class NoChat:
    eos_id = 1
  with pytest.raises(inputs.InputError, match="no chat template"):
    inputs.encode_texts(NoChat(), ["a"], chat=True, max_input_length=8)


def test_line_writer_resumes_after_complete_lines_only(tmp_path):
  path = str(tmp_path / "out.txt")
  w = outputs.LineWriter(path, total=4)
  assert w.done == 0
  w.write(["one", "two\nlines"])
  with open(path, "ab") as f:
    f.write(b"thr")  # a kill in the middle of a line
  w = outputs.LineWriter(path, total=4)
  assert w.done == 2
  w.write(["three", "four"])
  lines = open(path, encoding="utf-8").read().split("\n")
  assert lines == ["one", "two\\nlines", "three", "four", ""]
  assert outputs.unescape_line(lines[1]) == "two\nlines"
  with pytest.raises(outputs.OutputError, match="already has 4 lines, more than the 3 inputs"):
    outputs.LineWriter(path, total=3)


def test_line_writer_gz_with_header_drops_a_cut_member(tmp_path):
  path = str(tmp_path / "out.tsv.gz")
  w = outputs.LineWriter(path, total=3, header="en\tde", escape=False)
  w.write(["a\tA"])
  first = os.path.getsize(path)
  w.write(["b\tB"])
  os.truncate(path, first + 12)  # the second batch's gzip member cut short inside its compressed data
  w = outputs.LineWriter(path, total=3, header="en\tde", escape=False)
  assert w.done == 1
  w.write(["b\tB", "c\tC"])
  assert gzip.open(path, "rt").read() == "en\tde\na\tA\nb\tB\nc\tC\n"
  with pytest.raises(outputs.OutputError, match="not the header"):
    outputs.LineWriter(path, total=3, header="en\tde\tsource")


def test_escape_round_trip():
  for text in ("plain", "a\\nb", "two\nlines\r\n", "\\", "tab\tok"):
    escaped = outputs.escape_line(text)
    assert "\n" not in escaped and outputs.unescape_line(escaped) == text


def test_seeds_and_mesh_are_checked():
  seeds = [batching.item_seed(7, i) for i in range(100)]
  assert len(set(seeds)) == 100 and all(0 <= s <= batching.MAX_SEED for s in seeds)
  assert seeds == [batching.item_seed(7, i) for i in range(100)]
  assert batching.item_seed(8, 0) != seeds[0]
  for bad in (-1, 2**31, 1.5):
    with pytest.raises(inputs.InputError, match=r"seed must be an integer in \[0, 2\*\*31 - 1\]"):
      batching.check_seed(bad)
  assert cli_flags.parse_mesh("data:2,model:4") == {"data": 2, "model": 4} and cli_flags.parse_mesh("") == {}
  for bad in ("data:0", "data:2,data:2", "pipe:2", "data"):
    with pytest.raises(ValueError, match="--mesh"):
      cli_flags.parse_mesh(bad)


def test_markdown_table_is_aligned():
  lines = outputs.markdown_table(["a", "long header"], [[1, "x"], ["wide cell", 2.5]])
  assert len({len(line) for line in lines}) == 1  # every row as wide as the others
  assert lines[0] == "| a         | long header |" and lines[1] == "|-----------|-------------|"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  target, draft = tiny_pair(str(tmp_path_factory.mktemp("pair")))
  return jaxspec.load(target), jaxspec.load(draft)


def test_generate_all_drops_padding_and_keeps_one_output_per_item(pair):
  target, draft = pair
  ids = [[5, 6, 7, 1], [], [8, 9, 1], [10, 11, 12, 13, 1], []]
  seen = []
  run = batching.generate_all(target, ids, jaxspec.Speculation(draft, gamma=2), batch_size=2, max_new_tokens=5, compare=True, on_batch=lambda idx, texts: seen.append(idx), bar=False)
  assert seen == [[0, 1], [2, 3], [4]]
  assert sorted(run.texts) == [0, 1, 2, 3, 4] and run.texts[1] == run.texts[4] == ""
  assert len(run.stats.generated) == 3  # the real rows only: no padding copies, no empty items
  assert run.tokens == int(run.stats.generated.sum()) and run.identical is True
  assert set(run.compile_s) == {"speculative", "plain"}
  one = batching.generate_all(target, ids, jaxspec.Speculation(draft, gamma=2), batch_size=1, max_new_tokens=5, bar=False)
  assert one.texts == run.texts


def test_speculation_settings_reach_the_speculative_calls(pair):
  """A tuner's choice (a Speculation with a schedule and its values) goes to the speculative calls: the pool in
  translate.py crashed on the first adaptive choice (generate_all took no such argument)."""
  target, draft = pair
  ids = [[5, 6, 7, 1], [8, 9, 1], [10, 11, 12, 13, 1]]
  kw = dict(batch_size=2, max_new_tokens=6, compare=True, bar=False)
  constant = jaxspec.Speculation(draft, gamma=2)
  base = batching.generate_all(target, ids, constant, **kw)
  resting = batching.generate_all(target, ids, constant.replace(schedule="adaptive", fallback_alpha=1.0,
                                                                prior_alpha=0.0, probe_interval=1000), **kw)
  assert resting.texts == base.texts and resting.identical is True
  assert resting.stats.fallback_iterations.sum() == resting.stats.iterations.sum() > 0  # every iteration rested
  assert base.stats.fallback_iterations.sum() == 0
  # The job's summary of a run in which nothing was verified (alpha undefined) says so instead of failing.
  summary = "\n".join(report.speed_summary(resting, target, constant, jaxspec.Sampling(), 2))
  assert "no draft token was verified" in summary and "identical to plain greedy output: True" in summary


def test_sampled_outputs_depend_on_seed_and_index_only(pair):
  target, draft = pair
  ids = [[5 + i, 6, 7, 1] for i in range(5)]
  kw = dict(speculation=jaxspec.Speculation(draft, gamma=2), sampling=jaxspec.Sampling(temperature=1.0),
            max_new_tokens=6, seed=3, bar=False)
  by3 = batching.generate_all(target, ids, batch_size=3, **kw).texts
  by1 = batching.generate_all(target, ids, batch_size=1, **kw).texts
  resumed = batching.generate_all(target, ids, batch_size=3, start=2, **kw).texts
  assert by3 == by1
  assert all(resumed[i] == by1[i] for i in range(2, 5)) and 0 not in resumed
  other = batching.generate_all(target, ids, batch_size=3, **dict(kw, seed=4)).texts
  assert other != by3
