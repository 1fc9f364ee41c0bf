"""launch/serve.py over two processes x 2 CPU devices on localhost (gloo; a data:2 x model:2 mesh over both): process
0 serves HTTP and decides each step, process 1 makes the same engine calls (jaxspec/serving/hosts.py). Under the
verification budget (the default: process 0 chooses each step's tier and limits, process 1 runs its choice) the
official openai client's greedy answers equal `generate`'s on one device; SIGTERM to process 0 ends both, process 1 with
one line naming why; a follower killed mid-run ends process 0 (and so the job) in bounded time with one line. And, in
this process over a fake store: `Leader.stop` and `follow` return only once their threads are out of the store (a
thread still in a store call when the interpreter finalizes aborts the process: SIGTERM ended process 0 with -6)."""

from __future__ import annotations

import base64
import contextlib
import pickle
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

import jax
from jax._src import distributed

import jaxspec
from jaxspec.serving import hosts
from jaxspec.serving.server import free_port
from script_helpers import ROOT, compile_env, script_env

MODEL = "ende-target"
PROMPTS = ["The house is small.", "I like green tea.", "Where is the station?", "We read a book."]
MAX_NEW = 12


@contextlib.contextmanager
def _job(tmp_path, *flags: str, while_compiling=None):
  """Two serve.py processes (and `flags`), yielded once process 0 answers /health with 200: (processes, url,
  tail(i, chars), while_compiling()'s result, made while they start and compile), tail: the last `chars` of
  process i's output (None: all of it)."""
  port, coordinator = free_port(), free_port()
  env = script_env(XLA_FLAGS=compile_env()["XLA_FLAGS"] + " --xla_force_host_platform_device_count=2")
  common = ["--slots=4", "--max_input_length=16", f"--max_new_tokens={MAX_NEW}", "--gamma=2", "--modes=greedy",
            "--row_buckets=4", "--budget_repeats=1",
            "--mesh=data:2,model:2", f"--coordinator_address=127.0.0.1:{coordinator}", "--num_processes=2",
            f"--port={port}", "--log_level=warning"]
  logs = [open(tmp_path / f"process{i}.txt", "w+b") for i in range(2)]  # pylint: disable=consider-using-with
  procs = [subprocess.Popen([sys.executable, "launch/serve.py", *common, *flags, f"--process_id={i}"], cwd=ROOT,
                            env=env, stdout=logs[i], stderr=subprocess.STDOUT) for i in range(2)]

  def tail(i, chars=3000):
    logs[i].flush()
    logs[i].seek(0)
    text = logs[i].read().decode(errors="replace")
    return text[-chars:] if chars else text

  try:
    made = None if while_compiling is None else while_compiling()
    deadline = time.monotonic() + 900
    with httpx.Client(timeout=5) as poll:  # one client: each new one loads the CA bundle (0.1 s of CPU)
      while True:
        assert all(p.poll() is None for p in procs), tail(0) + tail(1)
        assert time.monotonic() < deadline, tail(0) + tail(1)
        try:
          if poll.get(f"http://127.0.0.1:{port}/health").status_code == 200:
            break
        except httpx.TransportError:
          pass
        time.sleep(0.5)
    yield procs, f"http://127.0.0.1:{port}", tail, made
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for log in logs:
      log.close()


def _reference() -> list[str]:
  """`generate`'s greedy answers on one device (made while the job starts)."""
  target = jaxspec.load(MODEL)
  out = jaxspec.generate(target, PROMPTS, max_new_tokens=MAX_NEW, max_input_length=16)
  return [target.tokenizer.decode(out.tokens[i, :out.lengths[i]]) for i in range(len(PROMPTS))]


@pytest.mark.slow
def test_two_processes_serve_generates_answers_and_end_on_sigterm(tmp_path):
  with _job(tmp_path, while_compiling=_reference) as (procs, url, tail, reference):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    answers = [client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=MAX_NEW).choices[0].text
               for p in PROMPTS]
    assert answers == reference, (answers, reference)
    logs = tail(0, None) + tail(1, None)
    assert "verification budget over draft lengths [0, 1, 2]" in logs, logs  # the default, as on one process
    assert "ready; step costs" in logs, logs  # warm-up timed the curves on both processes (process 0's choose)
    assert "runs on one process" not in logs, logs
    procs[0].send_signal(signal.SIGTERM)
    for p in procs:
      p.wait(120)  # both end, in bounded time
    assert [p.returncode for p in procs] == [0, 0], tail(0) + tail(1)
    assert "process 1: process 0's server stopped" in tail(1), tail(0) + tail(1)


@pytest.mark.slow
def test_a_follower_that_dies_ends_the_job(tmp_path):
  with _job(tmp_path, "--speculation=fixed") as (procs, url, tail, _):  # no budget to compile and time: not its point
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    client.completions.create(model=MODEL, prompt=PROMPTS[0], temperature=0, max_tokens=MAX_NEW)
    procs[1].kill()
    procs[0].wait(120)  # process 0 ends within the follower timeout (15 s) and a few seconds
    assert procs[0].returncode == 1, tail(0)
    assert "error: process 1 stopped answering (no sign of life for 15 s): every process stops." in tail(0), tail(0)


class SlowStore:
  """A distributed client whose store calls from `thread` take `call_s` (a store call in flight when a stop comes);
  call/0 is "stop". Records the store calls made after `closed` is set."""

  def __init__(self, thread: str, call_s: float = 0.5):
    self.thread, self.call_s = thread, call_s
    self.entered, self.closed, self.late = threading.Event(), threading.Event(), []

  def _call(self, name):
    if self.closed.is_set():
      self.late.append((name, threading.current_thread().name))
    if threading.current_thread().name == self.thread:
      self.entered.set()
      time.sleep(self.call_s)

  def key_value_try_get(self, key):
    self._call("try_get")
    return "1"

  def key_value_set(self, key, value, allow_overwrite=False):  # pylint: disable=unused-argument
    self._call("set")

  def key_value_delete(self, key):
    self._call("delete")

  def blocking_key_value_get(self, key, timeout_ms):  # pylint: disable=unused-argument
    self._call("blocking_get")
    if key == f"{hosts._PREFIX}0":  # pylint: disable=protected-access
      assert self.entered.wait(30)  # the beat is in a store call when the stop is read
      return base64.b64encode(pickle.dumps(("stop", ("the test stopped",), {}))).decode()
    return "1"


@pytest.fixture
def store(monkeypatch):
  def install(thread: str) -> SlowStore:
    client = SlowStore(thread)
    monkeypatch.setattr(distributed.global_state, "client", client)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(hosts, "_BEAT_S", 0.01)
    return client
  return install


def _alive(name: str) -> bool:
  return any(t.name == name and t.is_alive() for t in threading.enumerate())


def test_leader_stop_returns_once_its_watch_is_out_of_the_store(store):
  client = store("jaxspec-followers")
  leader = hosts.Leader(object())
  assert client.entered.wait(30)  # the watch is in a store call (0.5 s) ...
  leader.stop("the test stopped")  # ... which stop waits for (it returned at once: the process exited under it)
  client.closed.set()
  assert not _alive("jaxspec-followers")
  time.sleep(0.1)
  assert client.late == []
  leader.stop("again")  # once only
  assert client.late == []


def test_follow_returns_once_its_beat_is_out_of_the_store(store, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  client = store("jaxspec-alive")
  assert hosts.follow(object()) == "the test stopped"
  client.closed.set()
  assert not _alive("jaxspec-alive")
  time.sleep(0.1)
  assert client.late == []
