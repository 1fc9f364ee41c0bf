"""Timing helpers shared by the launch scripts: medians after warm-up, and the paper's cost ratios.

c = draft decoder step / target decoder step (1 token each); r = target step on gamma + 1 tokens / on 1 token.
Both are measured in isolation, on caches filled to a typical length, with compilation excluded.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from jaxspec.model import Model
from jaxspec.models import t5


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
  """Median wall time in seconds of fn() (which must block until its result is ready)."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


@functools.partial(jax.jit, static_argnums=0)
def _steps(cfg: t5.T5Config, params, cache, tokens, n_calls: int = 8):
  """n_calls decoder calls on the same cache position (each call is one real decoder step)."""
  def body(_, carry):
    # The tokens depend on the carry (by a term that is always 0) so XLA cannot hoist the call out of the loop.
    fed = tokens + (carry[:, None] > 1e30).astype(tokens.dtype)
    logits, _ = t5.decode(params, cfg, cache, fed)
    return carry + logits[:, 0, 0]
  return jax.lax.fori_loop(0, n_calls, body, jnp.zeros(tokens.shape[0], jnp.float32))


def decoder_step_time(model: Model, batch: int, tokens_per_call: int, prompt_len: int = 16, context: int = 16,
                      repeats: int = 5, n_calls: int = 16) -> float:
  """Seconds per decoder call feeding `tokens_per_call` tokens per row at position `context` (median)."""
  cfg = model.config
  ids = jnp.full((batch, prompt_len), 5, jnp.int32)
  cache = t5.init_cache(model.params, cfg, ids, context + tokens_per_call + 8)
  cache = cache.replace(lengths=jnp.full((batch,), context, jnp.int32))
  tokens = jnp.full((batch, tokens_per_call), 5, jnp.int32)
  return median_time(lambda: _steps(cfg, model.params, cache, tokens, n_calls).block_until_ready(),
                     repeats) / n_calls


def cost_ratios(target: Model, draft: Model, gamma: int, batch: int = 1, repeats: int = 5, rounds: int = 5) -> dict:
  """c and r for one gamma: see `cost_table`."""
  return cost_table(target, draft, [gamma], batch, repeats, rounds)[gamma]


def cost_table(target: Model, draft: Model, gammas: Sequence[int], batch: int = 1, repeats: int = 5,
               rounds: int = 5) -> dict:
  """{gamma: {target_step_s, target_verify_s, draft_step_s, c, r}} at one batch size.

  The target's 1-token step, its (gamma+1)-token step per gamma and the draft's 1-token step are timed in
  `rounds` interleaved rounds; each is the median over its rounds, so a slow spell of the machine does not land
  on one of them only.
  """
  runs: dict = {"t1": [], "d1": [], **{g: [] for g in gammas}}
  for _ in range(rounds):
    runs["t1"].append(decoder_step_time(target, batch, 1, repeats=repeats))
    runs["d1"].append(decoder_step_time(draft, batch, 1, repeats=repeats))
    for g in gammas:
      runs[g].append(decoder_step_time(target, batch, g + 1, repeats=repeats))
  t1, d1 = statistics.median(runs["t1"]), statistics.median(runs["d1"])
  return {g: {"target_step_s": t1, "target_verify_s": statistics.median(runs[g]), "draft_step_s": d1,
              "c": d1 / t1, "r": statistics.median(runs[g]) / t1} for g in gammas}
