"""Wall-clock timing shared by the scripts and notebooks: medians after warm-up, and interleaved rounds.

Every timed function must block until its result is ready (`jax.block_until_ready`, or a host copy). Warm-up
calls (compilation included) are timed apart and never enter a median. Interleaving runs every contender once per
round, in turn, so slow drifts of the machine (frequency, neighbours) fall on all of them alike. `compile_time`
measures what JAX spent lowering and compiling inside a block (jax.monitoring's events), so a warm-up's
compilation can be reported apart from its pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from typing import Any, Callable, Hashable, Iterator, Sequence

import jax
import jax.monitoring
import numpy as np


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
  """Median wall time in seconds of fn() over `repeats` calls, after `warmup` untimed calls."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


# Lowering to MLIR and XLA's compilation (or its retrieval from the persistent cache), once per executable. Tracing
# is left out: a jitted function traced inside another one reports its own trace inside the outer one's.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_to_mlir_module_duration", "/jax/core/compile/backend_compile_duration")


@dataclasses.dataclass
class CompileTime:
  """Seconds and executables JAX lowered and compiled while a `compile_time` block ran."""

  seconds: float = 0.0
  executables: int = 0


@contextlib.contextmanager
def compile_time() -> Iterator[CompileTime]:
  """with compile_time() as c: ...  ->  c.seconds spent in JAX's lowering and compilation (COMPILE_EVENTS) inside
  the block, c.executables XLA compilations. 0 when everything ran from JAX's in-memory caches."""
  total = CompileTime()

  def listener(event: str, duration: float, **_):
    if event in COMPILE_EVENTS:
      total.seconds += duration
      total.executables += event == COMPILE_EVENTS[-1]

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield total
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


@dataclasses.dataclass
class Passes:
  """One contender's result in `interleaved_passes`."""

  warmup_s: float  # The warm-up pass over all batches, compilation included.
  median_s: float  # The median pass (by total time) over the timed rounds.
  latencies_s: list[float]  # Per-batch latencies of that median pass.
  outputs: list[Any]  # fn(batch) of the warm-up pass, per batch.
  compile_s: float = 0.0  # Of warmup_s, JAX's lowering and compilation (`compile_time`).
  totals_s: list[float] = dataclasses.field(default_factory=list)  # Every timed round's total, in round order.


def interleaved_passes(fns: dict[Hashable, Callable[[Any], Any]], batches: Sequence[Any], repeats: int,
                       probe: Callable[[], Any] | None = None, on_round: Callable[[], None] | None = None
                       ) -> tuple[dict[Hashable, Passes], list[Any]]:
  """Times several contenders side by side over the same batches.

  One warm-up pass each (compilation included, timed apart; JAX's compilation in it also alone, as compile_s),
  then `repeats` rounds in each of which every contender runs one pass over all batches, in turn; round i starts
  at the i-th contender (the order rotates), so none always runs right after the same other one. `probe`, if
  given, runs once before the warm-ups (to compile it) and once per round (isolated cost measurements taken in the
  same minutes as the passes). `on_round` is called after the warm-up and after each round: repeats + 1 times
  (progress).
  Returns ({name: Passes}, [probe() of each round]).
  """
  first, compiled, outs, passes, probes = {}, {}, {}, {name: [] for name in fns}, []
  if probe is not None:
    probe()
  for name, fn in fns.items():
    start = time.perf_counter()
    with compile_time() as c:
      outs[name] = [fn(b) for b in batches]
    first[name], compiled[name] = time.perf_counter() - start, c.seconds
  if on_round is not None:
    on_round()
  names = list(fns)
  for i in range(repeats):
    if probe is not None:
      probes.append(probe())
    for name in names[i % len(names):] + names[:i % len(names)]:
      fn = fns[name]
      lat = []
      for b in batches:
        start = time.perf_counter()
        fn(b)
        lat.append(time.perf_counter() - start)
      passes[name].append((sum(lat), lat))
    if on_round is not None:
      on_round()
  result = {}
  for name, runs in passes.items():
    totals = [p[0] for p in runs]
    runs = sorted(runs, key=lambda p: p[0])
    total, lat = runs[len(runs) // 2]
    result[name] = Passes(first[name], total, lat, outs[name], compiled[name], totals)
  return result, probes


def median_tree(trees: Sequence[Any]) -> Any:
  """Leafwise median of same-shaped nested dicts / tuples of numbers (e.g. the probes of each round)."""
  return jax.tree.map(lambda *xs: float(np.median(xs)), *trees)


def percentiles(latencies: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
  """{'p50': ..., 'p90': ..., 'p99': ...} of a list of latencies in seconds."""
  return {f"p{q}": float(np.percentile(latencies, q)) for q in qs}
