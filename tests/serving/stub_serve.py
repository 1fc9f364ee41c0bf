"""`jaxspec.serving.server.run` (what launch/serve.py ends in) over the stub engine, for test_hostile.py's start-up
and shutdown tests without a compilation: `python tests/serving/stub_serve.py WARMUP`, WARMUP one of

    ok     the warm-up returns at once (the server becomes ready)
    fail   the warm-up raises (the server must exit 1 with the reason)
    hang   the warm-up blocks for 120 s, as a long compilation does, deaf to everything

It listens on 127.0.0.1, port 0 (a free one: the banner names it), and exits with run()'s status.
"""

from __future__ import annotations

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaxspec.cli import flags as cli_flags  # pylint: disable=wrong-import-position
from jaxspec.serving import server  # pylint: disable=wrong-import-position
from stub_engine import Settings, StubEngine  # pylint: disable=wrong-import-position


class CharTokenizer:
  """One id per character (no files): what the stub engine and the HTTP layer ask of a tokenizer."""
  vocab_size, eos_id = 260, 1

  def encode(self, text):
    return [4 + ord(c) % 250 for c in text]

  def decode(self, ids):
    return "".join(chr(i - 4 + 97 if 4 <= i < 30 else 32) for i in ids if i != self.eos_id)


class Engine(StubEngine):
  def __init__(self, warmup: str):
    super().__init__(CharTokenizer(), words=CharTokenizer().encode("the small house"))
    self.mode = warmup

  def warmup(self):
    if self.mode == "fail":
      raise RuntimeError("the stub's compilation broke")
    if self.mode == "hang":
      threading.Event().wait(120)


def main(argv):
  scheduler, app = server.build(Engine(argv[1]), model_name="stub", settings_type=Settings)
  sys.exit(server.run(scheduler, app, port=0, log_level="warning", banner=lambda port: f"serving stub on "
                      f"http://127.0.0.1:{port}/v1"))


if __name__ == "__main__":
  cli_flags.run(main)
