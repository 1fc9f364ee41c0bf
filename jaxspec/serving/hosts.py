"""Serving over several processes: process 0 decides, every process executes (vLLM's and SGLang's shape).

    engine = SlotEngine(target, speculation, slots=..., mesh=mesh)     # in every process, the same arguments
    if jax.process_index() == 0:
      engine = Leader(engine)            # the scheduler and HTTP drive it as they drive a SlotEngine
      ... server.run(...) ...; engine.stop("the server stopped")
    else:
      follow(engine)                     # until process 0 stops or is gone

    serve(engine, serve_http)            # all of the above (server.serve does it): serve_http(Leader) on process 0

The slot engine's device programs span every process's devices (its mesh), so every process must make the same
calls in the same order: insert, free, step, warmup. `Leader` publishes each call to the distributed runtime's
key-value store (JAX's coordination service, which `jax.distributed.initialize` already runs: no new service) under
a sequence number before making it; `follow` reads call n and makes it on its own engine, which keeps the same host
bookkeeping (active slots, row buckets, wakes) and so runs the same compiled programs on its own shards. Process 0
decides each step: `Leader.step` publishes its engine's `plan_step()` (the program key and, under the verification
budget, the per-slot draft limits from process 0's estimates and warmup's cost curves) and every process runs
exactly that (`step(program=, limits=)`): each process's warmup times its own curves (the same programs in the same
order), and a choice of their own would run other programs (a collective that never completes). Process 0
alone detokenizes and answers. A call its engine refuses on process 0 (a bad prompt, a busy slot) is refused the
same way on every process before any device work, and skipped.

Ending: `Leader.stop(reason)` publishes "stop" (`serve` does it when process 0's server ends: SIGTERM, Ctrl-C); a
follower ends with one line when it reads it, and when process 0 is gone (the store does not answer). A follower
shows a sign of life every second (a counter in the store, from its own thread, so also while it compiles); when
one shows none for 15 s (it died), process 0 ends with one line, and with it the store and every other process. Each call is
one small value (a pickle of the call's arguments); the calls every process has run are deleted by process 0
after each step (a step's device program needs every process, so all have read the calls before it). A thread of
this module is out of the store before `Leader.stop` and `follow` return (joined), and makes no JAX call (read up
front: after jax's exit clean-up one would build the backend again): a thread still inside such a C++ call
when the interpreter finalizes would be killed there, in C++, and abort the process ("FATAL: exception not
rethrown", status -6) instead of ending it with 0.
"""

from __future__ import annotations

import base64
import os
import pickle
import signal
import sys
import threading
import time
from typing import Any, Callable

import jax
from jax._src import distributed

_PREFIX = "jaxspec/serving/call/"
_POLL_MS = 1000  # a follower's wait for the next call, repeated while process 0 is alive
_BEAT_S = 1.0  # a follower's sign of life (a counter in the store, from a thread of its own)
_STALE_S = 15.0  # process 0 ends every process when a follower showed no sign of life for this long
_JOIN_S = 60.0  # the most a stop waits for a thread of this module to leave its store call


def _client():
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("serving over several processes needs jax.distributed.initialize (jaxspec.initialize_distributed)")
  return client


class Leader:
  """`engine` (a SlotEngine) whose insert, free, step and warmup are published to every process before they run
  here; everything else is the engine's."""

  def __init__(self, engine, stale_s: float = _STALE_S):
    self._engine, self._client, self._sent, self._deleted = engine, _client(), 0, 0
    self._processes = jax.process_count()  # read here: the watch thread makes no JAX call (at the exit, after
                                           # jax's clean-up, one would build the backend again, in C++)
    self._stopping = threading.Event()
    self._watcher = threading.Thread(target=self._watch, args=(stale_s,), name="jaxspec-followers", daemon=True)
    self._watcher.start()

  def _watch(self, stale_s: float) -> None:
    """Ends this process (and so every process: the store lives here) with one line when a follower that has
    shown signs of life shows none for stale_s seconds (it died, or its host did): a collective would wait for it
    forever."""
    seen: dict[int, tuple[str, float]] = {}
    while not self._stopping.wait(_BEAT_S):
      now = time.monotonic()
      for i in range(1, self._processes):
        if self._stopping.is_set():  # no store call once stop() began: it joins this thread before the exit
          return
        try:
          beat = self._client.key_value_try_get(f"{_PREFIX}alive/{i}")
        except Exception:  # pylint: disable=broad-except  (no sign of life yet: still starting)
          continue
        if i not in seen or seen[i][0] != beat:
          seen[i] = (beat, now)
        elif now - seen[i][1] > stale_s and not self._stopping.is_set():
          print(f"error: process {i} stopped answering (no sign of life for {stale_s:g} s): every process stops.",
                file=sys.stderr, flush=True)
          os._exit(1)  # pylint: disable=protected-access

  def __getattr__(self, name: str) -> Any:
    return getattr(self._engine, name)

  def _publish(self, name: str, *args, **kwargs) -> None:
    value = base64.b64encode(pickle.dumps((name, args, kwargs))).decode()
    self._client.key_value_set(f"{_PREFIX}{self._sent}", value)
    self._sent += 1

  def insert(self, slot, prompt_ids, settings):
    self._publish("insert", slot, list(prompt_ids), settings)
    return self._engine.insert(slot, prompt_ids, settings)  # the first token (InsertOutput), on every process

  def free(self, slot) -> None:
    self._publish("free", slot)
    self._engine.free(slot)

  def warmup(self) -> None:
    self._publish("warmup")
    self._engine.warmup()

  def step(self, *, program=None, limits=None):
    """The engine's step, its choice made here: without `program`, process 0's `plan_step()` (the program key and
    the verification budget's per-slot limits, from this process's estimates and cost curves) is published and
    every process runs exactly it, never a choice of its own."""
    if program is None and not self._engine.active_slots():
      return self._engine.step()  # nothing active: no device call anywhere
    if program is None:
      program, limits = self._engine.plan_step()
    if hasattr(limits, "tolist"):  # an array: plain Python numbers, a small pickle (checked by every engine alike)
      limits = limits.tolist()
    self._publish("step", program=program, limits=limits)
    out = self._engine.step(program=program, limits=limits)
    for n in range(self._deleted, self._sent):  # every process has read these calls (the step needed them all)
      self._client.key_value_delete(f"{_PREFIX}{n}")
    self._deleted = self._sent
    return out

  def stop(self, reason: str = "process 0 stopped", timeout_s: float = 30.0) -> None:
    """Ends every follower (one line each, naming `reason`); waits up to timeout_s for each to have read it (the
    store lives in process 0: it must outlive their last read). The follower watch is stopped and joined first: a
    thread still inside a store call when the interpreter finalizes is killed there, in C++, and the process
    aborts (SIGABRT, "FATAL: exception not rethrown") instead of ending with 0. Once only; later calls do nothing."""
    if self._stopping.is_set():
      return
    self._stopping.set()
    _join(self._watcher)
    self._publish("stop", reason)
    for i in range(1, self._processes):
      try:
        self._client.blocking_key_value_get(f"{_PREFIX}stopped/{i}", int(timeout_s * 1000))
      except Exception:  # pylint: disable=broad-except  (a follower already gone: nothing to wait for)
        pass


def follow(engine, poll_ms: int = _POLL_MS) -> str:
  """Makes process 0's calls on `engine` until it stops (returns its reason) or is gone (SystemExit with one
  line). Calls the engine refuses (a JaxspecError, as process 0's engine refused them) are skipped."""
  from jaxspec.errors import JaxspecError  # pylint: disable=import-outside-toplevel
  client, done, index = _client(), threading.Event(), jax.process_index()

  def beat():
    count = 0
    while not done.wait(_BEAT_S):
      count += 1
      try:
        client.key_value_set(f"{_PREFIX}alive/{index}", str(count), allow_overwrite=True)
      except Exception:  # pylint: disable=broad-except  (process 0 is gone: the main loop says so)
        return

  beating = threading.Thread(target=beat, name="jaxspec-alive", daemon=True)
  beating.start()
  try:
    return _follow(engine, client, poll_ms, JaxspecError)
  finally:
    done.set()
    _join(beating)  # out of the store before the caller exits (see Leader.stop)


def _join(thread: threading.Thread, timeout_s: float = _JOIN_S) -> None:
  """Joins a thread that makes store calls (each answers at once: bounded); says so on stderr if it did not end."""
  thread.join(timeout_s)
  if thread.is_alive():
    print(f"warning: the thread {thread.name} did not end within {timeout_s:g} s.", file=sys.stderr, flush=True)


def _follow(engine, client, poll_ms: int, refused) -> str:
  """`follow`'s loop: call n, then n + 1, ...; refused: the errors of a call process 0's engine refused too."""
  n = 0
  while True:
    try:
      value = client.blocking_key_value_get(f"{_PREFIX}{n}", poll_ms)
    except Exception as e:  # pylint: disable=broad-except  (a timeout: process 0 is idle; anything else: gone)
      if "DEADLINE_EXCEEDED" in str(e) or "timed out" in str(e).lower():
        continue
      raise SystemExit(f"error: process 0 is gone ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                       f"this process stops.") from None
    n += 1
    name, args, kwargs = pickle.loads(base64.b64decode(value))
    if name == "stop":
      client.key_value_set(f"{_PREFIX}stopped/{jax.process_index()}", "1")
      return args[0]
    try:
      getattr(engine, name)(*args, **kwargs)
    except refused:
      pass  # process 0's engine refused the same call before any device work


def serve(engine, serve_http: Callable[[Any], int]) -> int:
  """Process 0: serve_http(Leader(engine)) (the HTTP server, until it ends), then stops every follower, also after
  a SIGTERM; its status. Every other process: follows process 0 (one line when it starts and one when it ends), 0."""
  index = jax.process_index()
  if index != 0:
    print(f"process {index} of {jax.process_count()}: following process 0", flush=True)
    print(f"process {index}: {follow(engine)}", flush=True)
    return 0
  leader = Leader(engine)
  main = threading.current_thread() is threading.main_thread()
  if main:  # uvicorn re-raises the SIGTERM it caught once it has shut down: end through the `finally` then
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  try:
    return serve_http(leader)
  finally:
    if main:  # a second SIGTERM must not cut the stop short (its threads joined, the followers told)
      signal.signal(signal.SIGTERM, signal.SIG_IGN)
    leader.stop("process 0's server stopped")
