"""launch/serve.py over two processes x 2 CPU devices on localhost (gloo; a data:2 x model:2 mesh over both): process
0 serves HTTP and decides each step, process 1 makes the same engine calls (jaxspec/serving/hosts.py). The official
openai client's greedy answers equal `generate`'s on one device; SIGTERM to process 0 ends both, process 1 with
one line naming why; a follower killed mid-run ends process 0 (and so the job) in bounded time with one line."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

import jaxspec
from jaxspec.serving.server import free_port
from script_helpers import ROOT, compile_env, script_env

MODEL = "ende-target"
PROMPTS = ["The house is small.", "I like green tea.", "Where is the station?", "We read a book."]
MAX_NEW = 12


@contextlib.contextmanager
def _job(tmp_path):
  """Two serve.py processes, yielded once process 0 answers /health with 200: (processes, url, tail(i))."""
  port, coordinator = free_port(), free_port()
  env = script_env(XLA_FLAGS=compile_env()["XLA_FLAGS"] + " --xla_force_host_platform_device_count=2")
  common = ["--slots=4", "--max_input_length=16", f"--max_new_tokens={MAX_NEW}", "--gamma=3", "--modes=greedy",
            "--mesh=data:2,model:2", f"--coordinator_address=127.0.0.1:{coordinator}", "--num_processes=2",
            f"--port={port}", "--log_level=warning"]
  logs = [open(tmp_path / f"process{i}.txt", "w+b") for i in range(2)]  # pylint: disable=consider-using-with
  procs = [subprocess.Popen([sys.executable, "launch/serve.py", *common, f"--process_id={i}"], cwd=ROOT, env=env,
                            stdout=logs[i], stderr=subprocess.STDOUT) for i in range(2)]

  def tail(i):
    logs[i].flush()
    logs[i].seek(0)
    return logs[i].read().decode(errors="replace")[-3000:]

  try:
    deadline = time.monotonic() + 900
    while True:
      assert all(p.poll() is None for p in procs), tail(0) + tail(1)
      assert time.monotonic() < deadline, tail(0) + tail(1)
      try:
        if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
          break
      except httpx.TransportError:
        pass
      time.sleep(0.5)
    yield procs, f"http://127.0.0.1:{port}", tail
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for log in logs:
      log.close()


@pytest.mark.slow
def test_two_processes_serve_generates_answers_and_end_on_sigterm(tmp_path):
  target = jaxspec.load(MODEL)
  out = jaxspec.generate(target, PROMPTS, max_new_tokens=MAX_NEW, max_input_length=16)
  reference = [target.tokenizer.decode(out.tokens[i, :out.lengths[i]]) for i in range(len(PROMPTS))]
  with _job(tmp_path) as (procs, url, tail):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    answers = [client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=MAX_NEW).choices[0].text
               for p in PROMPTS]
    assert answers == reference, (answers, reference)
    procs[0].send_signal(signal.SIGTERM)
    for p in procs:
      p.wait(120)  # both end, in bounded time
    assert [p.returncode for p in procs] == [0, 0], tail(0) + tail(1)
    assert "process 1: process 0's server stopped" in tail(1), tail(0) + tail(1)


@pytest.mark.slow
def test_a_follower_that_dies_ends_the_job(tmp_path):
  with _job(tmp_path) as (procs, url, tail):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    client.completions.create(model=MODEL, prompt=PROMPTS[0], temperature=0, max_tokens=MAX_NEW)
    procs[1].kill()
    procs[0].wait(120)  # process 0 ends within the follower timeout (15 s) and a few seconds
    assert procs[0].returncode == 1, tail(0)
    assert "error: process 1 stopped answering (no sign of life for 15 s): every process stops." in tail(0), tail(0)
