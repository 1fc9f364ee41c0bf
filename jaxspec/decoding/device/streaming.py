"""Streaming: `generate(..., on_tokens=callback)` hands each iteration's new tokens to the host as they come.

At the end of every loop iteration an ordered `io_callback` sends the emitted block to the host, where
`callback(TokenChunk)` runs (in iteration order, once per iteration, before the loop's next iteration starts):

    def show(chunk):
      for row, new in enumerate(chunk.rows()):
        print(row, new, chunk.time)
    jaxspec.generate(target, texts, draft=draft, on_tokens=show)

Whether a callback is compiled in is static (`LoopSettings.streaming`): with on_tokens=None the loop has no
callback and no host round trip. Which callback runs is not: the compiled loop calls `_dispatch` with a runtime
stream id, which looks up the callback registered for this generate call, so a new callback (a new lambda per
call) never recompiles. An exception raised by the callback stops nothing inside the loop; `generate` raises
it once the loop ends (the remaining chunks of that call are dropped).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jaxspec.errors import SettingsError


@dataclasses.dataclass(frozen=True)
class TokenChunk:
  """The tokens one loop iteration emitted."""

  iteration: int  # loop iteration (0-based); one chunk per iteration, in order.
  tokens: np.ndarray  # [B, gamma + 1] int32: row b's new tokens are tokens[b, :counts[b]] (pad id after them).
  counts: np.ndarray  # [B] int32 new tokens per row (0 for finished rows; EOS included when emitted).
  time: float  # time.perf_counter() on the host when the chunk arrived: differences are inter-token latencies.

  def rows(self) -> list[list[int]]:
    """Each row's new tokens as a list (empty for rows with nothing new)."""
    return [row[:n].tolist() for row, n in zip(self.tokens, self.counts)]


@dataclasses.dataclass
class _Stream:
  callback: Callable[[TokenChunk], object]
  rows: int  # leading rows that are the caller's (the rest are padding rows, never shown)
  error: BaseException | None = None


_STREAMS: dict[int, _Stream] = {}
_IDS = itertools.count(1)
_LOCK = threading.Lock()


def _dispatch(packed) -> None:
  """On the host: packed [B, G + 4] int32 = tokens [B, G + 1], counts, iteration, stream id (see `emit`)."""
  arrived = time.perf_counter()
  packed = np.asarray(packed)
  stream = _STREAMS.get(int(packed[0, -1]))
  if stream is None or stream.error is not None:
    return
  rows = stream.rows
  chunk = TokenChunk(iteration=int(packed[0, -2]), tokens=packed[:rows, :-3], counts=packed[:rows, -3],
                     time=arrived)
  try:
    stream.callback(chunk)
  except BaseException as e:  # noqa: BLE001  (re-raised by `finish` on the caller's thread)
    stream.error = e


def emit(stream_id: jax.Array, iteration: jax.Array, tokens: jax.Array, counts: jax.Array) -> None:
  """Inside the loop: sends tokens [B, G + 1] and counts [B] of this iteration to the registered callback.

  One packed operand: each operand of a host callback costs a transfer (on a CPU, 4 operands cost ~3x one)."""
  column = jnp.ones((tokens.shape[0], 1), jnp.int32)
  packed = jnp.concatenate([tokens.astype(jnp.int32), counts.astype(jnp.int32)[:, None], column * iteration,
                            column * stream_id], axis=1)  # [B, G + 4]
  io_callback(_dispatch, None, packed, ordered=True)


def register(callback: Callable[[TokenChunk], object], rows: int) -> int:
  """A stream id for one generate call (the loop's runtime argument); `finish` it after the call."""
  if not callable(callback):
    raise SettingsError(f"on_tokens must be a callable taking a TokenChunk, got {type(callback).__name__}.")
  with _LOCK:
    stream_id = next(_IDS)
    _STREAMS[stream_id] = _Stream(callback=callback, rows=rows)
  return stream_id


def finish(stream_id: int) -> None:
  """Forgets the stream; raises the exception its callback raised, if any."""
  with _LOCK:
    stream = _STREAMS.pop(stream_id, None)
  if stream is not None and stream.error is not None:
    raise stream.error
