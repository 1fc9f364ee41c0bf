"""A stand-in for `jaxspec.serving.engine.SlotEngine` with known answers, for the HTTP layer's tests (errors, queue
bound, cancellation, metrics) where a real model would only add time: the same methods, no device.

Slot s decoding a prompt p emits its first token at insert, then each step `per_step` tokens, of a fixed cycle of
ordinary ids picked by (p[0], seed) (temperature 0 uses seed 0), ending with EOS after `eos_after` tokens when
that is set (not before min_tokens; never with ignore_eos), or "length" at max_tokens. `step_s` sleeps per step so
that a test can hold slots busy.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from jaxspec.decoding.settings import Sampling


@dataclasses.dataclass(frozen=True)
class Settings:
  max_tokens: int
  sampling: Sampling = Sampling()
  seed: int = 0
  ignore_eos: bool = False
  min_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class StepOutput:
  tokens: list
  finished: np.ndarray
  reasons: list
  drafted: np.ndarray
  accepted: np.ndarray


@dataclasses.dataclass(frozen=True)
class InsertOutput:
  tokens: list
  reason: str | None

  @property
  def finished(self):
    return self.reason is not None


class StubEngine:
  """Slots with scripted outputs; `owner` records the thread that calls it (the scheduler must use one)."""

  def __init__(self, tokenizer, *, slots=2, max_input_length=32, max_new_tokens=16, per_step=2, step_s=0.0,
               eos_after=None, words=None):
    self.tokenizer, self.slots = tokenizer, slots
    self.max_input_length, self.max_new_tokens = max_input_length, max_new_tokens
    self.per_step, self.step_s, self.eos_after = per_step, step_s, eos_after
    self.eos_ids = (tokenizer.eos_id,)
    self.cycle = [i for i in (words or tokenizer.encode("the small house is green and the river is bright")) if
                  i != tokenizer.eos_id]
    self.state = {}  # slot -> [prompt, settings, emitted]
    self.threads = set()
    self.inserted = 0
    self.freed = []

  def _touch(self):
    self.threads.add(threading.get_ident())

  def warmup(self):
    self._touch()

  def free_slots(self):
    self._touch()
    return [s for s in range(self.slots) if s not in self.state]

  def check_request(self, settings):
    """The engine's own check (SlotEngine.check_request): called by the handler's thread, so not _touch'ed."""

  def insert(self, slot, prompt_ids, settings):
    """The first token now (as SlotEngine.insert); a request whose first token ends it leaves its slot free."""
    self._touch()
    assert slot not in self.state and 0 <= slot < self.slots, slot
    assert 0 < len(prompt_ids) <= self.max_input_length
    self.inserted += 1
    full = self.expected(list(prompt_ids), settings)
    if len(full) == 1:
      return InsertOutput(full, "stop" if full[0] == self.tokenizer.eos_id else "length")
    self.state[slot] = [list(prompt_ids), settings, 1]
    return InsertOutput(full[:1], None)

  def free(self, slot):
    self._touch()
    self.freed.append(slot)
    self.state.pop(slot, None)

  def expected(self, prompt_ids, settings):
    """The whole output for a request (what the server's text must decode from)."""
    seed = settings.seed if settings.sampling.mode != "greedy" else 0
    start = (prompt_ids[0] + 7 * seed) % len(self.cycle)
    out = [self.cycle[(start + i) % len(self.cycle)] for i in range(settings.max_tokens)]
    eos_after = None if self.eos_after is None else max(self.eos_after, settings.min_tokens)
    if eos_after is not None and eos_after < settings.max_tokens and not settings.ignore_eos:
      out = out[:eos_after] + [self.tokenizer.eos_id]
    return out

  def step(self):
    self._touch()
    if self.step_s:
      time.sleep(self.step_s)
    tokens, finished, reasons = [[] for _ in range(self.slots)], np.zeros(self.slots, bool), [None] * self.slots
    for slot, st in list(self.state.items()):
      prompt, settings, done = st
      full = self.expected(prompt, settings)
      new = full[done:done + self.per_step]
      st[2] = done + len(new)
      tokens[slot] = new
      if st[2] >= len(full):
        finished[slot] = True
        reasons[slot] = "stop" if full[-1] == self.tokenizer.eos_id else "length"
        del self.state[slot]
    n = np.array([len(t) for t in tokens])
    return StepOutput(tokens, finished, reasons, drafted=n * 2, accepted=np.maximum(n - 1, 0))
