"""Generation over any number of inputs: fixed-size batches, per-item seeds, warm-up, timing and a plain twin.

    run = generate_all(target, ids, jaxspec.Speculation(draft, gamma=3), batch_size=8, compare=True)
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
import time
from typing import Callable, Sequence

import numpy as np

import jaxspec
from jaxspec.tools.outputs import progress
from jaxspec.decoding.arguments import bucket_length
from jaxspec.decoding.generation import MAX_INPUT_LENGTH
from jaxspec import checks
from jaxspec.checks import MAX_SEED
from jaxspec.errors import InputError


def check_seed(seed: int, name: str = "seed") -> int:
  """`jaxspec.checks.check_seed`, an InputError (a flag's or a file's value)."""
  return checks.check_seed(seed, name, error=InputError)


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


def _decode(target, rows: list[list[int]], seeds: list[int], real: int, speculation, sampling, **kw):
  """(texts, lengths [real], tokens [real, N], stats) of the first `real` rows of a padded batch, each row with
  its own seed."""
  out = jaxspec.generate(target, rows, speculation, sampling, seed=0 if sampling.greedy else list(seeds), **kw)
  texts = out.texts[:real] if out.texts is not None else [
      " ".join(map(str, t[:n])) for t, n in zip(out.tokens[:real], out.lengths[:real])]
  return texts, out.lengths[:real], out.tokens[:real], out.stats.select(slice(0, real))


def generate_all(target, items: Sequence[Sequence[int]], speculation: jaxspec.Speculation | None = None,
                 sampling: jaxspec.Sampling | None = None, *, batch_size: int = 1, max_new_tokens: int = 64,
                 seed: int = 0, max_input_length: int = MAX_INPUT_LENGTH, compare: bool = False, start: int = 0,
                 on_batch: Callable[[list[int], list[str]], None] | None = None, desc: str = "generate",
                 bar: bool = True) -> BatchRun:
  """Decodes items[start:] (token-id lists; [] = empty item) with `target`, speculatively with `speculation`.

  Args:
    speculation, sampling: as `jaxspec.generate` takes them (None: plain; greedy).
    compare: also decode every batch plainly (no draft), timed right after the speculative call; at
      temperature 0 `identical` then says whether both gave the same tokens.
    start: items before it are already done (a resumed run); their seeds and outputs are not touched.
    on_batch: called after every batch with (item indices, output texts), in order (to write or print them).
    desc, bar: the progress bar's label; bar=False shows none.
  """
  checks.check_int(batch_size, "batch_size", 1, error=InputError)
  check_seed(seed)
  batch_size = max(min(batch_size, len(items) - start), 1)  # No call pads beyond the items there are.
  sampling = jaxspec.Sampling() if sampling is None else sampling
  kw = dict(max_new_tokens=max_new_tokens, max_input_length=max_input_length)
  decoders = {"speculative": speculation} if speculation is not None else {"plain": None}
  if compare and speculation is not None:
    decoders["plain"] = None
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
      for name, spec in decoders.items():
        if bucket not in warmed:
          t0 = time.perf_counter()
          _decode(target, rows, seeds, len(real), spec, sampling, **kw)
          run.compile_s[name] = run.compile_s.get(name, 0.0) + time.perf_counter() - t0
        t0 = time.perf_counter()
        results[name] = _decode(target, rows, seeds, len(real), spec, sampling, **kw)
        run.seconds[name] += time.perf_counter() - t0
      warmed.add(bucket)
      texts, lengths, tokens, stats = results[main]
      run.tokens += int(lengths.sum())
      run.stats_parts.append(stats)
      if "plain" in results and main != "plain" and sampling.greedy:
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
