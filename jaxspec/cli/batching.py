"""Generation over any number of inputs: fixed-size batches, per-item seeds, warm-up, timing and a plain twin.

    run = generate_all(target, ids, draft=draft, gamma=3, batch_size=8, temperature=0.0, compare=True)
    run.texts[i], run.stats.alpha, run.ms_per_token("speculative"), run.identical

Every call has the same batch size (a short last batch is filled with copies of its last row, whose outputs and
stats are dropped), so each prompt-length bucket compiles once; the first batch of every bucket is decoded once
untimed (the warm-up, compilation included, timed apart in `compile_s`). Item i is sampled with the seed
`item_seed(seed, i)`, so neither the batch size nor a resume point changes its output (except when sampling
under schedule "heuristic" / "adaptive", whose draft length is the batch's: docs/reliability.md). Empty items
([]) give empty outputs without a model call.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import numpy as np

import jaxspec
from jaxspec.cli.inputs import InputError
from jaxspec.cli.outputs import progress

try:
  from jaxspec.decoding.engine import MAX_INPUT_LENGTH, bucket_length
except ImportError:  # Keyed on the exact length instead: more warm-ups than needed, never a compile timed.
  MAX_INPUT_LENGTH = 512  # generate's default longest prompt
  bucket_length = lambda n, max_input_length: n  # pylint: disable=unnecessary-lambda-assignment

MAX_SEED = 2**31 - 1


def check_seed(seed: int, name: str = "seed") -> int:
  if not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
    raise InputError(f"{name} must be an integer in [0, 2**31 - 1], got {seed!r}.")
  return int(seed)


def item_seed(seed: int, index: int) -> int:
  """The sampling seed of item `index` under base seed `seed`: a hash of both, in [0, 2**31 - 1]."""
  return int(np.random.SeedSequence([check_seed(seed), index]).generate_state(1)[0]) & MAX_SEED


@dataclasses.dataclass
class BatchRun:
  """What `generate_all` did: outputs per item index, the real rows' stats, and the timings."""

  texts: dict[int, str] = dataclasses.field(default_factory=dict)
  stats_parts: list = dataclasses.field(default_factory=list)  # DecodeStats per batch, padding rows dropped.
  tokens: int = 0  # Tokens generated for real rows by the timed (speculative, or only) decoder.
  seconds: dict[str, float] = dataclasses.field(default_factory=lambda: {"speculative": 0.0, "plain": 0.0})
  compile_s: dict[str, float] = dataclasses.field(default_factory=dict)  # Warm-up calls, per decoder.
  identical: bool | None = None  # With compare at temperature 0: plain tokens == speculative tokens.

  @property
  def stats(self):
    return jaxspec.DecodeStats.concatenate(self.stats_parts) if self.stats_parts else None

  def ms_per_token(self, decoder: str) -> float:
    return 1e3 * self.seconds[decoder] / max(self.tokens, 1)


class _Decoder:
  """Decodes one padded batch with per-row seeds (row by row where this jaxspec takes one seed per call)."""

  def __init__(self, target, knobs: dict):
    self.target, self.knobs, self.per_row_seeds = target, knobs, None

  def __call__(self, rows: list[list[int]], seeds: list[int], real: int, **kw):
    """(texts, lengths [real], tokens [real, N], stats) of the first `real` rows of the batch."""
    if self.knobs["temperature"] == 0:
      return self._trim(jaxspec.generate(self.target, rows, seed=0, **self.knobs, **kw), real)
    if self.per_row_seeds is not False:
      try:
        out = jaxspec.generate(self.target, rows, seed=list(seeds), **self.knobs, **kw)
        self.per_row_seeds = True
        return self._trim(out, real)
      except (TypeError, ValueError):
        if self.per_row_seeds:
          raise
        result = self._row_by_row(rows, seeds, real, **kw)  # Raises the error again unless it was the seed's.
        self.per_row_seeds = False
        logging.warning("this jaxspec.generate takes one seed per call: sampling decodes row by row, so that each "
                        "item's output depends only on the seed and its index.")
        return result
    return self._row_by_row(rows, seeds, real, **kw)

  def _row_by_row(self, rows: list[list[int]], seeds: list[int], real: int, **kw):
    parts = [self._trim(jaxspec.generate(self.target, [r], seed=s, **self.knobs, **kw), 1)
             for r, s in zip(rows[:real], seeds[:real])]
    return (sum((p[0] for p in parts), []), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), jaxspec.DecodeStats.concatenate([p[3] for p in parts]))

  def _trim(self, out, real: int):
    texts = out.texts[:real] if out.texts is not None else [
        " ".join(map(str, t[:n])) for t, n in zip(out.tokens[:real], out.lengths[:real])]
    return texts, out.lengths[:real], out.tokens[:real], out.stats.select(slice(0, real))


def generate_all(target, items: Sequence[Sequence[int]], *, draft=None, gamma: int = 4, batch_size: int = 1,
                 max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0, max_input_length: int = MAX_INPUT_LENGTH, compare: bool = False, start: int = 0,
                 on_batch: Callable[[list[int], list[str]], None] | None = None, desc: str = "generate",
                 bar: bool = True, speculation: dict | None = None) -> BatchRun:
  """Decodes items[start:] (token-id lists; [] = empty item) with `target`, speculatively when `draft` is given.

  Args:
    compare: also decode every batch plainly (no draft), timed right after the speculative call; at
      temperature 0 `identical` then says whether both gave the same tokens.
    start: items before it are already done (a resumed run); their seeds and outputs are not touched.
    on_batch: called after every batch with (item indices, output texts), in order (to write or print them).
    desc, bar: the progress bar's label; bar=False shows none.
    speculation: more jaxspec.generate arguments of the speculative calls only (schedule and its knobs, e.g. a
      tuner's choice).
  """
  if batch_size < 1:
    raise InputError(f"batch_size must be >= 1, got {batch_size}.")
  check_seed(seed)
  batch_size = max(min(batch_size, len(items) - start), 1)  # No call pads beyond the items there are.
  knobs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
               max_input_length=max_input_length)
  decode = _Decoder(target, knobs)
  decoders = ({"speculative": dict(draft=draft, gamma=gamma, **(speculation or {}))} if draft is not None
              else {"plain": {}})
  if compare and draft is not None:
    decoders["plain"] = {}
  main = next(iter(decoders))
  run, warmed = BatchRun(), set()
  pbar = progress(len(items), desc, initial=start) if bar else None
  for k in range(start, len(items), batch_size):
    idx = list(range(k, min(k + batch_size, len(items))))
    real = [i for i in idx if len(items[i])]
    out = {}
    if real:
      rows = [list(items[i]) for i in real]
      rows += [rows[-1]] * (batch_size - len(rows))  # Constant batch size: one compilation per bucket.
      seeds = [item_seed(seed, i) for i in real]
      seeds += [seeds[-1]] * (batch_size - len(seeds))
      bucket = bucket_length(max(map(len, rows)), max_input_length)
      results = {}
      for name, kw in decoders.items():
        if bucket not in warmed:
          t0 = time.perf_counter()
          decode(rows, seeds, len(real), **kw)
          run.compile_s[name] = run.compile_s.get(name, 0.0) + time.perf_counter() - t0
        t0 = time.perf_counter()
        results[name] = decode(rows, seeds, len(real), **kw)
        run.seconds[name] += time.perf_counter() - t0
      warmed.add(bucket)
      texts, lengths, tokens, stats = results[main]
      run.tokens += int(lengths.sum())
      run.stats_parts.append(stats)
      if "plain" in results and main != "plain" and temperature == 0:
        same = np.array_equal(results["plain"][2], tokens)
        run.identical = same if run.identical is None else run.identical and same
      out = dict(zip(real, texts))
    texts = [out.get(i, "") for i in idx]
    run.texts.update(zip(idx, texts))
    if on_batch is not None:
      on_batch(idx, texts)
    if pbar is not None:
      pbar.update(len(idx))
  if pbar is not None:
    pbar.close()
  return run
