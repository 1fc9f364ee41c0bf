"""jaxspec.serving.text.TextStream: incremental text deltas whose concatenation is the decode of the whole output,
a character split over tokens held back until complete, stop strings cut where they begin (also across steps)."""

from __future__ import annotations

import pytest

from jaxspec.serving.text import TextStream


class ByteTokenizer:
  """Token i is byte i (ids >= 256: the text of WORDS[i - 256]); decode replaces broken UTF-8 with U+FFFD, as
  byte-level tokenizers do."""
  WORDS = ["Hello", " world", "!", "\n\n", "END"]

  def decode(self, ids):
    data = b"".join(bytes([i]) if i < 256 else self.WORDS[i - 256].encode() for i in ids)
    return data.decode("utf-8", errors="replace")


def _run(steps, stops=()):
  s = TextStream(ByteTokenizer(), stops)
  deltas = [s.add(step) for step in steps]
  return deltas, s.flush(), s.stopped


def test_deltas_concatenate_to_the_whole_decode():
  steps = [[256], [257, 258], [], [259, 260]]
  deltas, tail, stopped = _run(steps)
  assert "".join(deltas) + tail == "Hello world!\n\nEND" and not stopped
  assert deltas[0] == "Hello" and deltas[1] == " world!"


def test_a_multibyte_character_waits_for_its_last_byte():
  e_acute = list("é".encode())  # two bytes, two tokens
  deltas, tail, _ = _run([[256, e_acute[0]], [e_acute[1], 258]])
  assert deltas == ["Hello", "é!"] and tail == ""


@pytest.mark.parametrize("steps,stops,text", [
    ([[256, 257], [258, 259, 260]], ["!"], "Hello world"),          # inside one step
    ([[256, 257], [258]], [" wor"], "Hello"),                       # a stop inside a token
    ([[256], [ord(" "), ord("w")], [ord("o"), ord("r")], [260]], [" wor"], "Hello"),  # across steps
    ([[256], [257]], ["ld!", "zz"], "Hello world"),                  # a prefix held back, then released at the end
])
def test_stop_strings(steps, stops, text):
  deltas, tail, stopped = _run(steps, stops)
  assert "".join(deltas) + tail == text
  assert stopped == (text != "Hello world" or stops == ["!"])
  for d in deltas:
    assert not any(s in d for s in stops)


def test_held_back_prefix_is_not_sent_early():
  s = TextStream(ByteTokenizer(), ["ld!"])
  assert s.add([256, 257]) == "Hello wor"  # "ld" could begin the stop string
  assert s.add([ord("x")]) == "ldx" and not s.stopped
