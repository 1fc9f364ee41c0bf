"""The first token at insert through the scheduler (issue 39): a request's first token reaches its client, and TTFT is
observed, when the engine's insert returns, before any step runs; a request that its first token ends (max_tokens
1, a stop string) finishes there without a step. Over the stub engine (tests/serving/stub_engine.py), whose steps
here wait at a gate the test opens; the real engine's insert: test_slot_engine.py."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from jaxspec.serving.metrics import Metrics
from jaxspec.serving.requests import Request
from jaxspec.serving import scheduler as scheduler_module
from jaxspec.serving.scheduler import Event, Scheduler
from stub_engine import Settings, StubEngine

PROMPT = (0, 11, 12)  # the stub's output starts at its cycle's first id: "t"


class CharTokenizer:
  """One id per character."""
  vocab_size, eos_id = 256, 1

  def encode(self, text):
    return [ord(c) for c in text]

  def decode(self, ids):
    return "".join(chr(i) for i in ids if i != self.eos_id)


class GatedEngine(StubEngine):
  """Every step waits for `gate` (bounded) and is counted."""

  def __init__(self):
    super().__init__(CharTokenizer(), slots=2, words=CharTokenizer().encode("the small house"))
    self.gate = threading.Event()
    self.steps_started = self.steps_done = 0

  def step(self):
    self.steps_started += 1
    assert self.gate.wait(30), "the test never opened the gate"
    out = super().step()
    self.steps_done += 1
    return out


def _request(max_tokens: int, stop: tuple[str, ...] = ()) -> Request:
  return Request(kind="completion", model="stub", prompt_ids=PROMPT, max_tokens=max_tokens, temperature=0.0,
                 top_p=1.0, top_k=0, seed=0, stop=stop, stream=True, include_usage=False)


@pytest.fixture()
def running():
  engine = GatedEngine()
  metrics = Metrics(engine.slots)
  scheduler = Scheduler(engine, queue_size=4, metrics=metrics, settings_type=Settings)
  scheduler.start()
  assert scheduler.ready.wait(30)
  yield engine, scheduler, metrics
  engine.gate.set()
  scheduler.stop()


def _ttft_count(metrics: Metrics) -> float:
  return metrics.registry.get_sample_value("jaxspec_time_to_first_token_seconds_count")


async def _next(handle) -> Event:
  return await asyncio.wait_for(handle.queue.get(), 30)


def test_the_first_token_streams_before_any_step(running):
  engine, scheduler, metrics = running
  want = engine.expected(list(PROMPT), Settings(max_tokens=6))

  async def main():
    handle = scheduler.submit(_request(6), asyncio.get_running_loop())
    first = await _next(handle)
    assert first.text == engine.tokenizer.decode(want[:1]) and first.finish_reason is None
    assert engine.steps_done == 0 and _ttft_count(metrics) == 1  # TTFT observed at the insert
    engine.gate.set()
    rest = [await _next(handle) for _ in range(4)]  # steps of 2, 2 and 1 tokens, then the finish
    assert "".join(e.text for e in [first] + rest) == engine.tokenizer.decode(want)
    assert rest[-1].finish_reason == "length" and engine.steps_done >= 3 and _ttft_count(metrics) == 1

  asyncio.run(main())


@pytest.mark.parametrize("max_tokens,stop,reason", [(1, (), "length"), (6, ("t",), "stop")])
def test_a_request_its_first_token_ends_finishes_without_a_step(running, max_tokens, stop, reason):
  """max_tokens 1, or a stop string in the first token's text ("t": the stub's cycle starts with it here): the
  request ends at its insert, its slot free again, and no step runs (the gate stays shut)."""
  engine, scheduler, _ = running
  assert engine.tokenizer.decode(engine.expected(list(PROMPT), Settings(max_tokens=1))) == "t"

  async def main():
    handle = scheduler.submit(_request(max_tokens, stop), asyncio.get_running_loop())
    events = [await _next(handle)]
    while events[-1].finish_reason is None:
      events.append(await _next(handle))
    assert events[-1].finish_reason == reason
    assert "".join(e.text for e in events) == ("t" if reason == "length" else "")
    assert scheduler.active == 0 and not engine.state and engine.steps_started == 0

  asyncio.run(main())


async def _until(condition, seconds: float = 30.0) -> bool:
  """Polls `condition` without holding the event loop, for at most `seconds`."""
  deadline = time.monotonic() + seconds
  while not condition():
    if time.monotonic() > deadline:
      return False
    await asyncio.sleep(0.001)
  return True


@pytest.mark.parametrize("wait_s", [30.0, 0.0])
def test_the_step_waits_until_a_lone_requests_first_token_is_sent(running, monkeypatch, wait_s):
  """The only request decoding: the engine thread runs no step until the stream handled its first token (the
  event loop busy 0.2 s after submitting: the wait holds the step). Negative control (wait 0): the step runs
  while the event loop is busy."""
  engine, scheduler, _ = running
  monkeypatch.setattr(scheduler_module, "FIRST_TOKEN_WAIT_S", wait_s)
  engine.gate.set()

  async def main():
    handle = scheduler.submit(_request(6), asyncio.get_running_loop())
    time.sleep(0.2)  # the event loop is busy: the first token's event waits to be handled
    events = handle.events()
    first = await asyncio.wait_for(events.__anext__(), 30)
    started_before = engine.steps_started
    rest = [await asyncio.wait_for(events.__anext__(), 30)]
    while rest[-1].finish_reason is None:
      rest.append(await asyncio.wait_for(events.__anext__(), 30))
    assert first.text == "t" and rest[-1].finish_reason == "length"
    return started_before

  started_before = asyncio.run(main())
  assert (started_before == 0) == (wait_s > 0)


def test_the_step_does_not_wait_for_a_first_token_beside_other_requests(running, monkeypatch):
  """Another request is decoding: the steps go on while the new request's stream has not handled its first
  token (a wait would hold every other request's tokens)."""
  engine, scheduler, _ = running
  monkeypatch.setattr(scheduler_module, "FIRST_TOKEN_WAIT_S", 30.0)
  # The first request would decode 999 steps of 1 token (50 s): it is still decoding when the second is inserted
  # and two steps run beside it, however loaded the machine (with 15 steps of 0.5 s, and before with 8 in 0.8 s and
  # 15 in 3 s, a full run's load delayed the insert until the first request had finished, and the second, then
  # alone, rightly waited for its first token: a failure of the test, not of the scheduler); then both are
  # cancelled.
  engine.step_s, engine.per_step, engine.max_new_tokens = 0.05, 1, 1000
  engine.gate.set()

  async def main():
    loop = asyncio.get_running_loop()
    first = scheduler.submit(_request(1000), loop)
    consumer = asyncio.create_task(_drain(first))  # handles every event of the first request as it comes
    assert await _until(lambda: first.sent.is_set())
    second = scheduler.submit(_request(16), loop)
    assert await _until(lambda: second.puts > 0)  # inserted: its first token is put, not yet handled
    steps = engine.steps_started
    assert await _until(lambda: engine.steps_started > steps + 1, 10)  # steps ran meanwhile
    assert not first.done and not second.sent.is_set()
    second.cancel()
    first.cancel()  # a client gone: its stream ends without an event, so its consumer is stopped here
    consumer.cancel()
    assert await _until(lambda: not engine.state)  # both slots freed

  asyncio.run(main())


async def _drain(handle) -> list[Event]:
  return [event async for event in handle.events()]
