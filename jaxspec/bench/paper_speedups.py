"""The paper's Table 2 speedups measured without pretrained weights: random-weight T5 shapes, oracle drafts.

For each Table 2 row at temperature 0: a T5-XXL-shaped target and a draft of the row's shape (T5-small, -base or
-large), both with random weights. The draft runs inside `oracle.OracleDecoder`: every step costs what that
draft's step costs, and the target accepts its proposals at the row's alpha, i.i.d. (Theorem 3.8's model). Plain
and speculative greedy decoding of the same inputs are timed end to end (prefill included, as the paper's wall
times are) and loop only. c and r are timed as the loop runs the models: caches carried and written in place (a
draft step feeds the previous step's argmax; a verify call of gamma + 1 tokens is rolled back each time). Each row
gives the measured speedup, Theorem 3.8's with the measured c and r at the realised alpha, and the paper's.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec.bench import presets
from jaxspec.bench import oracle
from jaxspec.decoding.device import loop, sampling
from jaxspec.decoding import theory
from jaxspec.models import t5


def random_t5(shape: str, dtype, seed: int) -> tuple[t5.T5Decoder, dict]:
  """A T5 decoder of a public checkpoint's shape ('t5-small' ... 't5-11b') with random weights."""
  model = jaxspec.Model.random(t5.T5Config(**T5_SHAPES[shape]), seed, dtype, name=shape)
  return model.decoder(), model.params


def random_inputs(count: int, length: int, bucket: int, vocab: int, seed: int = 0) -> list[tuple]:
  """`count` batch-1 inputs of `length` random ids padded to `bucket`: [(ids [1, bucket], lengths [1])]."""
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(count):
    ids = np.zeros((1, bucket), np.int32)
    ids[0, :length] = rng.randint(3, vocab, size=length)
    out.append((jnp.asarray(ids), jnp.full((1,), length, jnp.int32)))
  return out


@functools.lru_cache(maxsize=None)
def _jits(options: tuple):
  """(prefill, run) jitted as the engine jits them, with XLA compiler options ((name, value), ...)."""
  copts = dict(options) or None
  return (jax.jit(loop.prefill, static_argnums=0, compiler_options=copts),
          jax.jit(loop.run, static_argnums=0, donate_argnums=(3, 4), compiler_options=copts))


def decode_once(settings: loop.LoopSettings, target_params, draft_params, ids, lengths, options: tuple = ()):
  """One greedy decode: (final LoopState, prefill seconds, loop seconds)."""
  prefill, run = _jits(options)
  start = time.perf_counter()
  target_cache, draft_cache, first = jax.block_until_ready(prefill(settings, target_params, draft_params, ids,
                                                                   lengths))
  mid = time.perf_counter()
  state = jax.block_until_ready(run(settings, target_params, draft_params, target_cache, draft_cache, first,
                                    sampling.SamplingKnobs.create(0.0, 0, 1.0), jnp.zeros((1,), jnp.uint32),
                                    jnp.zeros((1,), jnp.int32)))
  return state, mid - start, time.perf_counter() - mid


def time_decodes(settings: loop.LoopSettings, target_params, draft_params_of, inputs: Sequence[tuple],
                 repeats: int, options: tuple = ()) -> dict:
  """One warm-up decode per input (compilation), then `repeats` rounds over the inputs.

  Args:
    draft_params_of: input index -> the draft's params for that input (the oracle's answer key differs).
  Returns:
    {prefill_s, loop_s, total_s: the median round's sums over inputs, tokens, iterations, accepted,
     beta_sum, beta_count: summed over inputs, compile_s: the warm-up round}.
  """
  start = time.perf_counter()
  states = [decode_once(settings, target_params, draft_params_of(i), ids, lens, options)[0]
            for i, (ids, lens) in enumerate(inputs)]
  compile_s = time.perf_counter() - start
  rounds = []
  for _ in range(repeats):
    parts = [decode_once(settings, target_params, draft_params_of(i), ids, lens, options)[1:]
             for i, (ids, lens) in enumerate(inputs)]
    rounds.append((sum(p for p, _ in parts), sum(q for _, q in parts)))
  rounds.sort(key=lambda r: r[0] + r[1])
  prefill_s, loop_s = rounds[len(rounds) // 2]
  stat = lambda f: int(sum(int(np.asarray(f(s)).sum()) for s in states))
  return {"prefill_s": prefill_s, "loop_s": loop_s, "total_s": prefill_s + loop_s, "compile_s": compile_s,
          "tokens": stat(lambda s: s.lengths - 1), "iterations": stat(lambda s: s.stats.iterations),
          "accepted": stat(lambda s: s.stats.accepted), "beta_sum": float(sum(float(s.stats.beta_sum.sum())
                                                                               for s in states)),
          "beta_count": stat(lambda s: s.stats.beta_count), "states": states}


@functools.partial(jax.jit, static_argnums=(0, 4))
def _prefill_cache(decoder, params, ids, lengths, cache_len: int):
  return decoder.prefill(params, ids, lengths, cache_len).cache


@functools.partial(jax.jit, static_argnums=(0, 3, 4), donate_argnums=2)
def _carried_calls(decoder, params, cache, width: int, calls: int):
  """`calls` decoder calls on a carried cache: width 1 feeds each call's argmax (a draft's scan); width > 1 feeds
  the same block at the same positions each time (a verify call, then the loop's rollback)."""
  start = cache.positions

  def body(carry, _):
    cache, tokens = carry
    res = decoder.step(params, cache, tokens)
    logits, cache = res.logits, res.cache
    if width == 1:
      tokens = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
    else:
      cache = cache.rollback(start)
    return (cache, tokens), None

  tokens = jnp.full((start.shape[0], width), 5, jnp.int32)
  (cache, tokens), _ = jax.lax.scan(body, (cache, tokens), None, length=calls)
  return cache.rollback(start), tokens


def step_time(decoder, params, ids, lengths, width: int, context: int = 16, calls: int = 32,
              repeats: int = 7) -> float:
  """Median seconds per decoder call feeding `width` tokens at loop position `context` (caches carried)."""
  cache = _prefill_cache(decoder, params, ids, lengths, context + width * calls + 2)
  cache = cache.rollback(jnp.full(lengths.shape, context, jnp.int32))
  cache, _ = jax.block_until_ready(_carried_calls(decoder, params, cache, width, calls))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    cache, _ = jax.block_until_ready(_carried_calls(decoder, params, cache, width, calls))
    times.append(time.perf_counter() - start)
  return statistics.median(times) / calls


def measure_row(row: presets.PaperRow, target, target_params, draft, draft_params, inputs, greedy, plain: dict,
                costs: dict, max_new_tokens: int, repeats: int, options: tuple = (), seed: int = 0) -> dict:
  """One Table 2 row with the oracle draft: speculative timings against `plain`'s, the cost model, the paper's.

  Args:
    greedy: per input, the target's greedy tokens [1, >= max_new_tokens + row.gamma + 1].
    plain: `time_decodes` of plain decoding on the same inputs and max_new_tokens.
    costs: {"target_step_s", "draft_step_s"} and {("verify", gamma): seconds}.
  """
  settings = oracle.oracle_settings(target, oracle.OracleDecoder(draft), row.gamma, max_new_tokens)
  params = [oracle.oracle_params(draft_params, g, np.full((1,), seed + i, np.uint32), row.alpha)
            for i, g in enumerate(greedy)]
  spec = time_decodes(settings, target_params, lambda i: params[i], inputs, repeats, options)
  c = costs["draft_step_s"] / costs["target_step_s"]
  r = costs[("verify", row.gamma)] / costs["target_step_s"]
  alpha_hat = spec["beta_sum"] / max(spec["beta_count"], 1)
  tokens = spec["tokens"]
  out = {"task": row.task, "draft": f"t5-{row.draft}", "temperature": row.temperature, "gamma": row.gamma,
         "alpha": row.alpha, "alpha_realised": alpha_hat, "tokens_per_iteration": tokens / spec["iterations"],
         "c": c, "r": r, "target_step_ms": costs["target_step_s"] * 1e3, "draft_step_ms": costs["draft_step_s"] * 1e3,
         "plain_ms_per_token": plain["total_s"] / plain["tokens"] * 1e3,
         "spec_ms_per_token": spec["total_s"] / tokens * 1e3,
         "plain_loop_ms_per_token": plain["loop_s"] / plain["tokens"] * 1e3,
         "spec_loop_ms_per_token": spec["loop_s"] / tokens * 1e3,
         "spec_ms_per_iteration": spec["loop_s"] / spec["iterations"] * 1e3,
         "model_ms_per_iteration": (row.gamma * costs["draft_step_s"] + costs[("verify", row.gamma)]) * 1e3,
         "expected": theory.expected_speedup(row.alpha, row.gamma, c, r),
         "expected_realised_alpha": theory.expected_speedup(min(alpha_hat, 1.0), row.gamma, c, r),
         "expected_r1_c0": theory.expected_tokens_per_iteration(row.alpha, row.gamma),
         "paper_speedup": row.speedup, "paper_c": row.c, "paper_expected": row.exp}
  out["speedup"] = out["plain_ms_per_token"] / out["spec_ms_per_token"]
  out["speedup_loop"] = out["plain_loop_ms_per_token"] / out["spec_loop_ms_per_token"]
  out["loop_over_model"] = out["spec_ms_per_iteration"] / out["model_ms_per_iteration"]
  return out


HEADER = ["task", "draft", "gamma", "alpha (paper / realised)", "c", "r", "tok/iter", "plain ms/tok",
          "spec ms/tok", "speedup", "loop only", "Thm 3.8 (c, r)", "loop / model", "paper", "paper Exp (c)"]


def table_row(m: dict) -> list:
  """A markdown row of `HEADER` from `measure_row`'s dict."""
  return [m["task"], m["draft"], m["gamma"], f"{m['alpha']:.2f} / {m['alpha_realised']:.3f}", f"{m['c']:.4f}",
          f"{m['r']:.3f}", f"{m['tokens_per_iteration']:.2f}", f"{m['plain_ms_per_token']:.3f}",
          f"{m['spec_ms_per_token']:.3f}", f"{m['speedup']:.2f}x", f"{m['speedup_loop']:.2f}x",
          f"{m['expected_realised_alpha']:.2f}", f"{m['loop_over_model']:.3f}", f"{m['paper_speedup']}x",
          f"{m['paper_expected']} ({m['paper_c']})"]


def sweep(target_shape: str, rows: Sequence[presets.PaperRow], dtype, max_new_tokens: int, num_inputs: int,
          input_length: int, bucket: int, repeats: int, options: tuple = (), log=print) -> dict:
  """Every row against one plain baseline: {"costs", "plain", "rows"} (see `measure_row`)."""
  target, target_params = random_t5(target_shape, dtype, seed=0)
  vocab = target.config.vocab_size
  inputs = random_inputs(num_inputs, input_length, bucket, vocab)
  ids0, lens0 = inputs[0]
  longest = max(r.gamma for r in rows)
  greedy = [oracle.greedy_tokens(target, target_params, ids, lens, max_new_tokens + longest + 1)
            for ids, lens in inputs]
  costs = {"target_step_s": step_time(target, target_params, ids0, lens0, 1)}
  for g in sorted({r.gamma for r in rows}):
    costs[("verify", g)] = step_time(target, target_params, ids0, lens0, g + 1, calls=8)
  log(f"target {target_shape}: {costs}")
  plain = time_decodes(oracle.plain_settings(target, max_new_tokens), target_params, lambda i: None, inputs,
                       repeats, options)
  plain.pop("states")
  log(f"plain: {plain}")
  measured, drafts = [], {}
  for i, row in enumerate(rows):
    shape = f"t5-{row.draft}"
    if shape not in drafts:
      drafts.clear()  # One draft's weights at a time.
      drafts[shape] = random_t5(shape, dtype, seed=1)
      draft, draft_params = drafts[shape]
      costs = {**costs, "draft_step_s": step_time(draft, draft_params, ids0, lens0, 1)}
    draft, draft_params = drafts[shape]
    m = measure_row(row, target, target_params, draft, draft_params, inputs, greedy, plain, costs,
                    max_new_tokens, repeats, options, seed=100 * i)
    log(" | ".join(map(str, table_row(m))))
    measured.append(m)
  json_costs = {k if isinstance(k, str) else f"verify_{k[1]}_s": v for k, v in costs.items()}
  return {"target": target_shape, "costs": json_costs, "plain": plain, "rows": measured}
