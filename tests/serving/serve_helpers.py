"""launch/serve.py as a subprocess for the serving tests: started on a free port of 127.0.0.1 with the tests'
fast-compiling XLA flags (`script_helpers.script_env`), its log kept and printed when the module ends."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from typing import Callable

import httpx

from jaxspec.serving.server import free_port
from script_helpers import ROOT, script_env


# The embedded pair's server as test_server.py, test_soak_server.py and test_guidellm.py start it: one set of
# compiled programs (slots, lengths, draft length, row bucket and modes decide them), so that the modules after
# the first load theirs from the run's compilation cache instead of compiling them again.
EMBEDDED_SLOTS, EMBEDDED_MAX_NEW = 3, 16
EMBEDDED_SERVER = [f"--slots={EMBEDDED_SLOTS}", "--max_input_length=16", f"--max_new_tokens={EMBEDDED_MAX_NEW}",
                   "--iterations_per_step=1", "--gamma=2", "--budget_repeats=1", f"--row_buckets={EMBEDDED_SLOTS}",
                   "--modes=greedy", "--modes=sampled"]


def _tail(log) -> str:
  log.flush()
  log.seek(0)
  return log.read().decode(errors="replace")[-4000:]


@contextlib.contextmanager
def serve(args: list[str], log_path, while_compiling: Callable[[], object] | None = None, timeout: float = 600):
  """Yields (url, health codes seen until ready, while_compiling()'s result, made once the server answered and
  while it compiled). The server is terminated on exit."""
  port = free_port()
  log = open(log_path, "w+b")  # pylint: disable=consider-using-with
  proc = subprocess.Popen([sys.executable, "launch/serve.py", f"--port={port}", "--log_level=warning", *args],
                          cwd=ROOT, env=script_env(), stdout=log, stderr=subprocess.STDOUT)
  url = f"http://127.0.0.1:{port}"
  try:
    codes, deadline, made = [], time.monotonic() + timeout, None
    with httpx.Client(timeout=5) as poll:  # one client: each new one loads the CA bundle (0.1 s of CPU)
      while not codes or codes[-1] != 200:
        if codes and made is None and while_compiling is not None:
          made = while_compiling()
        assert proc.poll() is None, _tail(log)
        assert time.monotonic() < deadline, f"the server was not ready in {timeout:g} s\n{_tail(log)}"
        try:
          codes.append(poll.get(url + "/health").status_code)
        except httpx.TransportError:
          pass
        time.sleep(0.2)
    if made is None and while_compiling is not None:
      made = while_compiling()
    yield url, codes, made
  finally:
    proc.terminate()
    try:
      proc.wait(30)
    except subprocess.TimeoutExpired:
      proc.kill()
    print(_tail(log))  # shown when a test failed: the server's own log
    log.close()
