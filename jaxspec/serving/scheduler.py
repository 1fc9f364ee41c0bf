"""The request queue and the one thread that owns the slot engine.

    scheduler = Scheduler(engine, queue_size=64, metrics=Metrics(engine.slots))
    scheduler.start()                         # the engine thread: warmup (compiles everything), then the loop
    handle = scheduler.submit(request, asyncio.get_running_loop())   # APIError 429 when the queue is full
    async for event in handle.events():       # Event(text=delta) ..., then Event(finish_reason="stop"|"length")
      ...
    handle.cancel()                           # a client gone: its slot is freed before the next step

The engine is synchronous and not thread-safe, so only the engine thread calls it. Its loop: free the slots of
cancelled requests, insert waiting requests into free slots (first come, first served; each insert returns the
request's first token, handed on at once; when they are the only requests decoding, the step waits until their
streams sent it: `_send_first`), run one `engine.step()` (a few loop iterations over every active slot,
one device-to-host copy), then per slot turn the new tokens into text (`TextStream`: incremental detokenization
and stop strings; a stop string frees the slot at once) and hand the deltas to the request's asyncio consumer
(`loop.call_soon_threadsafe`). Requests wait in a bounded queue: `submit` refuses one more with 429. Latencies go
to `Metrics` as they happen: TTFT from arrival to the insert that returned the first token (never a step: issue
39), inter-token latency as a step's time spread over the tokens it gave a request.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import threading
import time

from jaxspec.decoding.settings import Sampling
from jaxspec.serving.metrics import Metrics
from jaxspec.serving.requests import APIError, Request, RequestSettings
from jaxspec.serving.text import TextStream

_IDLE_WAIT_S = 0.5  # the engine thread sleeps at most this long when nothing runs (woken by submit and cancel)
# The engine thread waits at most this long for the streamed first tokens of requests it just inserted to be sent
# before it runs the next step, when those are the only requests decoding (`_send_first`).
FIRST_TOKEN_WAIT_S = 0.01


@dataclasses.dataclass(frozen=True)
class Event:
  """What a request's consumer receives: a text delta, then one last event with finish_reason ("stop",
  "length") or error (a message: the request failed on the server). completion_tokens: the request's tokens so
  far when the event was made (a chunk's usage with continuous_usage_stats)."""
  text: str = ""
  finish_reason: str | None = None
  error: str | None = None
  completion_tokens: int = 0


class Handle:
  """One submitted request: its events arrive on an asyncio queue of the submitting event loop."""

  def __init__(self, scheduler: "Scheduler", request: Request, loop: asyncio.AbstractEventLoop, number: int):
    self.scheduler, self.request, self.loop, self.number = scheduler, request, loop, number
    self.queue: asyncio.Queue = asyncio.Queue()
    self.arrival = time.perf_counter()
    self.slot: int | None = None
    self.completion_tokens = 0
    self.first_token_at: float | None = None
    self.last_token_at: float | None = None
    self.done = False       # the last event was put (engine thread)
    self.cancelled = False
    self.text: TextStream | None = None
    self.settings = None  # the engine's RequestSettings (made by submit)
    self.puts = 0  # events put on the queue (engine thread)
    self.sent = threading.Event()  # its consumer took an event and handled it (a streamed chunk: sent)

  @property
  def prompt_tokens(self) -> int:
    return len(self.request.prompt_ids)

  def _put(self, event: Event) -> None:
    self.puts += 1
    try:
      self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
    except RuntimeError:  # the event loop is closed (shutdown): nobody listens any more
      pass

  async def events(self):
    """The request's events, up to and including the last one (finish_reason or error)."""
    while True:
      event = await self.queue.get()
      yield event
      self.sent.set()  # the consumer handled it (a stream wrote its chunk) and asks for the next one
      if event.finish_reason is not None or event.error is not None:
        return

  def cancel(self) -> None:
    """Stops the request (its client is gone); safe to call from any thread, any number of times."""
    self.scheduler.cancel(self)


class Scheduler:
  """Owns `engine` from one thread; see the module docstring."""

  def __init__(self, engine, *, queue_size: int, metrics: Metrics | None = None, settings_type=None):
    if queue_size < 0:
      raise ValueError(f"queue_size must be >= 0, got {queue_size}.")
    self.engine, self.queue_size = engine, queue_size
    self.metrics = metrics or Metrics(engine.slots)
    self.settings_type = RequestSettings if settings_type is None else settings_type
    self.tokenizer = engine.tokenizer
    self.ready = threading.Event()
    self.failure: str | None = None  # why warmup failed (GET /health says it)
    self._cond = threading.Condition()
    self._waiting: collections.deque[Handle] = collections.deque()
    self._cancels: list[Handle] = []
    self._active: dict[int, Handle] = {}
    self._stop = False
    self._numbers = itertools.count()
    self._thread = threading.Thread(target=self._run, name="jaxspec-engine", daemon=True)

  # ---- any thread -------------------------------------------------------------------------------------------
  def start(self) -> None:
    self._thread.start()

  def stop(self, timeout: float = 30.0) -> None:
    with self._cond:
      self._stop = True
      self._cond.notify_all()
    if self._thread.is_alive():
      self._thread.join(timeout)

  @property
  def active(self) -> int:
    """Requests holding a slot now."""
    with self._cond:
      return len(self._active)

  @property
  def waiting(self) -> int:
    """Requests waiting for a slot."""
    with self._cond:
      return len(self._waiting)

  def submit(self, request: Request, loop: asyncio.AbstractEventLoop) -> Handle:
    """Queues the request; APIError 429 when queue_size requests already wait beyond the free slots, 503 before
    warmup is done."""
    if not self.ready.is_set():
      why = (self.failure or "compiling (GET /health says when)").rstrip(".")  # (a failure ends in its own period)
      raise APIError(503, f"the server is not ready: {why}.",
                     type="server_error", code="not_ready")
    try:  # the engine's own checks, in the caller's thread: a refused setting is the client's 400
      sampling = Sampling(request.temperature, request.top_k, request.top_p)
      settings = self.settings_type(max_tokens=request.max_tokens, sampling=sampling, seed=request.seed,
                                    ignore_eos=request.ignore_eos, min_tokens=request.min_tokens)
      self.engine.check_request(settings)
    except ValueError as e:
      raise APIError(400, str(e), code="invalid_value") from None
    handle = Handle(self, request, loop, next(self._numbers))
    handle.settings = settings
    with self._cond:
      if len(self._active) + len(self._waiting) >= self.engine.slots + self.queue_size:  # beyond free slots
        raise APIError(429, f"the request queue is full ({len(self._waiting)} waiting, {len(self._active)} decoding, for {self.engine.slots} slots): "
                       "retry later.", type="rate_limit_error", code="queue_full")
      self._waiting.append(handle)
      self.metrics.queue_length.set(len(self._waiting))
      self._cond.notify_all()
    return handle

  def cancel(self, handle: Handle) -> None:
    with self._cond:
      if handle.done or handle.cancelled:
        return
      handle.cancelled = True
      if handle in self._waiting:
        self._waiting.remove(handle)
        self.metrics.queue_length.set(len(self._waiting))
        handle.done = True
      else:
        self._cancels.append(handle)
        self._cond.notify_all()

  # ---- the engine thread ------------------------------------------------------------------------------------
  def _run(self) -> None:
    try:
      self.engine.warmup()
    except Exception as e:  # pylint: disable=broad-except  (reported by /health, never silently)
      logging.exception("warmup failed")
      self.failure = f"warmup failed: {type(e).__name__}: {e}"
      return
    costs = getattr(self.engine, "costs", None)  # the verification budget's step-cost curves, if it measured them
    for rows, gamma in sorted(getattr(costs, "seconds", {})):  # read when scraped: the steps served refine them
      self.metrics.step_cost.labels(rows=str(rows), gamma=str(gamma)).set_function(
          lambda key=(rows, gamma): costs.seconds[key])
    self.ready.set()
    while True:
      with self._cond:
        while not (self._stop or self._cancels or self._active or self._waiting):
          self._cond.wait(_IDLE_WAIT_S)
        if self._stop:
          break
        cancels, self._cancels = self._cancels, []
      for handle in cancels:
        if handle.slot is not None and self._active.get(handle.slot) is handle:
          self._release(handle)
          handle.done = True
      self._send_first(self._admit())
      if self._active:
        self._step()
    for handle in list(self._active.values()):
      self._finish(handle, error="the server is shutting down")

  def _release(self, handle: Handle) -> None:
    """Frees the handle's slot on the engine (a stop string, a client gone, a failure)."""
    slot = handle.slot
    if self._active.get(slot) is handle:
      del self._active[slot]
      self.metrics.active_slots.set(len(self._active))
      try:
        self.engine.free(slot)
      except Exception:  # pylint: disable=broad-except
        logging.exception("engine.free(%d) failed", slot)

  def _admit(self) -> list[Handle]:
    """Inserts waiting requests into free slots, handing on each one's first token; returns the handles inserted."""
    free, admitted = [s for s in self.engine.free_slots() if s not in self._active], []
    while free:
      with self._cond:
        if not self._waiting:
          break
        handle = self._waiting.popleft()
        self.metrics.queue_length.set(len(self._waiting))
      slot = free.pop(0)
      r = handle.request
      started = time.perf_counter()
      try:
        first = self.engine.insert(slot, list(r.prompt_ids), handle.settings)
      except Exception as e:  # pylint: disable=broad-except  (one request's failure, said to its client)
        logging.exception("insert failed")
        free.insert(0, slot)
        self._finish(handle, error=f"the engine could not take the request: {type(e).__name__}: {e}")
        continue
      handle.slot = slot
      admitted.append(handle)
      handle.text = TextStream(self.tokenizer, r.stop)
      self._active[slot] = handle
      self.metrics.prompt_tokens.inc(len(r.prompt_ids))
      self.metrics.active_slots.set(len(self._active))
      self._deliver(handle, first.tokens, first.reason, started, time.perf_counter())  # the first token, now
      if self._active.get(slot) is not handle:  # it ended at its first token: the slot is free again
        free.insert(0, slot)
    return admitted

  def _send_first(self, admitted: list[Handle]) -> None:
    """The first token reaches the client before the next step (issue 39): when the requests just inserted are the
    only ones decoding, waits (FIRST_TOKEN_WAIT_S at most) until their streams sent the events the inserts put.
    Otherwise the step starts at once: the event loop is still sending the previous step's tokens, which a wait
    would hold every request's next step for. (On a machine of few cores the step's threads leave the event loop
    little CPU: at concurrency 1 on the 2-core CPU, sending the first token during a drafting step put TTFT P50 at
    10 ms against plain's 8.)"""
    streams = [h for h in admitted if h.request.stream and h.puts]
    if not streams or any(h not in admitted for h in self._active.values()):
      return
    deadline = time.perf_counter() + FIRST_TOKEN_WAIT_S
    for handle in streams:
      if not handle.sent.wait(max(0.0, deadline - time.perf_counter())):
        return

  def _step(self) -> None:
    started = time.perf_counter()
    queue = getattr(self.engine, "set_queue", None)  # the slot engine's budget counts free slots as empty
    if queue is not None:
      with self._cond:
        waiting = len(self._waiting)
      queue(waiting)
    try:
      out = self.engine.step()
    except Exception as e:  # pylint: disable=broad-except  (every active request fails; the loop goes on)
      logging.exception("engine.step failed")
      for handle in list(self._active.values()):
        self._release(handle)
        self._finish(handle, error=f"decoding failed: {type(e).__name__}: {e}")
      return
    now = time.perf_counter()
    entry = getattr(out, "entry", None)
    if entry is not None:
      self.metrics.steps.labels(gamma=str(entry.gamma)).inc()
    iterations = getattr(out, "iterations", None)
    if iterations is not None:
      self.metrics.verifications.inc(int(sum(int(x) for x in iterations)))
    self.metrics.drafted.inc(int(sum(int(x) for x in out.drafted)))
    self.metrics.accepted.inc(int(sum(int(x) for x in out.accepted)))
    for slot, handle in list(self._active.items()):
      tokens = list(out.tokens[slot]) if slot < len(out.tokens) else []
      self._deliver(handle, tokens, out.reasons[slot] if out.finished[slot] else None, started, now)

  def _deliver(self, handle: Handle, tokens: list[int], reason: str | None, started: float, now: float) -> None:
    """Hands an insert's or a step's tokens to the request and ends it where they end it (reason: the engine
    finished the slot: "stop", "length" or "error"; a stop string in the text ends it too)."""
    if tokens:
      self._tokens(handle, tokens, started, now)
    if handle.text.stopped:  # a stop string: the slot is freed now, whatever the engine decided
      self._release(handle)
      self._finish(handle, "stop")
    elif reason is not None:
      del self._active[handle.slot]
      self.metrics.active_slots.set(len(self._active))
      if reason == "error":
        self._finish(handle, error="the target's logits turned non-finite (NaN or inf) for this request")
      else:
        self._finish(handle, reason)

  def _tokens(self, handle: Handle, tokens: list[int], started: float, now: float) -> None:
    """TTFT at the request's first tokens (its insert's); each later token observes the time since the request's
    previous tokens spread over this step's tokens (the first delivery's other tokens, if any: its time spread over
    all of them)."""
    n = len(tokens)
    if handle.first_token_at is None:
      handle.first_token_at = now
      self.metrics.ttft.observe(now - handle.arrival)
      rest, gap = n - 1, (now - started) / n
    else:
      rest, gap = n, (now - handle.last_token_at) / n
    for _ in range(rest):
      self.metrics.itl.observe(gap)
    handle.last_token_at = now
    handle.completion_tokens += n
    self.metrics.completion_tokens.inc(n)
    delta = handle.text.add(tokens)
    if delta:
      handle._put(Event(text=delta, completion_tokens=handle.completion_tokens))  # pylint: disable=protected-access

  def _finish(self, handle: Handle, reason: str | None = None, error: str | None = None) -> None:
    if error is None and handle.text is not None:
      tail = handle.text.flush()
      if tail:
        handle._put(Event(text=tail, completion_tokens=handle.completion_tokens))  # pylint: disable=protected-access
    handle.done = True
    if error is None:
      self.metrics.e2e.observe(time.perf_counter() - handle.arrival)
    handle._put(Event(finish_reason=reason, error=error,  # pylint: disable=protected-access
                      completion_tokens=handle.completion_tokens))
