"""Chains against token trees, timed side by side (issue 22; docs/bench/trees.md).

`compare` decodes the same inputs, for each (temperature, batch size), with plain decoding, chains and trees, in
interleaved passes (`timing.interleaved_passes`: a warm-up pass with compilation, then medians over the rounds),
and reports per variant: tau (tokens per target call), acceptance per depth, ms per token and the speedup over
plain decoding; at temperature 0 whether the output equals plain decoding's. r(N) is the target's tree call over N
nodes (with the ancestor mask, `Decoder.step` with `tree`: `tree_step_time`) over its 1-token step, timed alone.
Compilation is reported apart from the timed passes: each variant's warm-up pass and JAX's compilation in it.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.bench import costs, timing
from jaxspec.bench.sweep import fixed_batches
from jaxspec.decoding.drafters.tree import ancestors_of
from jaxspec.models.contract import TreeNodes


@functools.partial(jax.jit, static_argnums=(0, 6))
def _tree_steps(decoder, params, cache, tokens, depths, ancestors, n_calls: int):
  """n_calls tree calls on the same cache position (as costs._steps for `step`)."""
  def body(_, carry):
    fed = tokens + (carry[:, None] > 1e30).astype(tokens.dtype)
    logits = decoder.step(params, cache, fed, tree=TreeNodes(depths, ancestors)).logits
    return carry + logits[:, 0, 0]
  return jax.lax.fori_loop(0, n_calls, body, jnp.zeros(tokens.shape[0], jnp.float32))


def heap_tree(nodes: int, top_k: int, batch: int) -> tuple[jax.Array, jax.Array]:
  """(depths [B, N], ancestors [B, N, N]) of a full top_k-ary tree of N = nodes + 1 nodes (node i's parent is
  (i - 1) // top_k): a shape to time (a call's cost does not depend on which tree it is)."""
  n = nodes + 1
  parents = np.asarray([-1] + [(i - 1) // max(top_k, 1) for i in range(1, n)], np.int32)
  depths = np.zeros(n, np.int32)
  for i in range(1, n):
    depths[i] = depths[parents[i]] + 1
  parents = jnp.broadcast_to(jnp.asarray(parents), (batch, n))
  return jnp.broadcast_to(jnp.asarray(depths), (batch, n)), ancestors_of(parents, int(depths.max()))


def tree_step_time(model: jaxspec.Model, batch: int, tree: jaxspec.Tree, prompt_len: int = 16, context: int = 16,
                   repeats: int = 5, n_calls: int = 8) -> float:
  """Seconds per tree `step` call over N = tree.nodes + 1 nodes (median; over `costs.decoder_step_time` of one
  token: r(N))."""
  n = tree.nodes + 1
  cache = costs._filled_cache(model, batch, n, prompt_len, context)  # pylint: disable=protected-access
  depths, ancestors = heap_tree(tree.nodes, tree.top_k, batch)
  tokens = jnp.full((batch, n), 5, jnp.int32)
  return timing.median_time(lambda: _tree_steps(model.decoder(), model.params, cache, tokens, depths, ancestors,
                                                n_calls).block_until_ready(), repeats) / n_calls


def _label(speculation: jaxspec.Speculation | None) -> str:
  if speculation is None:
    return "plain"
  tree = speculation.tree
  shape = "chain" if tree is None else f"tree K={tree.top_k} N={tree.nodes}"
  name = getattr(speculation.draft, "name", None) or type(speculation.draft).__name__
  name = os.path.basename(name.rstrip("/")) or name  # a checkpoint directory: its last part
  return f"{name} {shape} gamma={speculation.gamma}"


def compare(target: jaxspec.Model, variants: Sequence[jaxspec.Speculation], ids: Sequence[list[int]],
            temperatures: Sequence[float], batch_sizes: Sequence[int], repeats: int, max_new_tokens: int,
            cost_repeats: int = 5, cost_calls: int = 8, keep_tokens: bool = False) -> list[dict]:
  """One row per (temperature, batch size, variant), plain decoding included (see the module docstring).

  Args:
    cost_repeats, cost_calls: r(N)'s timing: the median of cost_repeats blocks of cost_calls calls (after one
      warm-up block), per call; 1 and a few calls for models whose step takes hundreds of ms.
    keep_tokens: plain rows at temperature 0 get "token_ids" (the new tokens per input, EOS included), to compare
      with another implementation's greedy output.
  Rows also hold the wall seconds of each variant's warm-up pass ("compile_and_first_pass_s") and of JAX's
  compilation in it ("compile_s"); r's probes, their compilation included, are "probe_s" of the batch size.
  """
  rows = []
  for batch in batch_sizes:
    batches = fixed_batches(ids, batch)
    real = [min(batch, len(ids) - k) for k in range(0, len(ids), batch)]  # rows that are not padding copies
    start = time.perf_counter()
    step = functools.partial(costs.decoder_step_time, target, batch, repeats=cost_repeats, n_calls=cost_calls)
    one = step(1)  # r's denominator: a 1-token step
    r_of = {}
    for v in variants:
      if v.tree is not None:
        r_of[_label(v)] = tree_step_time(target, batch, v.tree, repeats=cost_repeats, n_calls=cost_calls) / one
      elif v.gamma not in r_of:
        r_of[v.gamma] = step(v.gamma + 1) / one
    probe_s = time.perf_counter() - start
    print(f"batch={batch}: r(N) probes {probe_s:.1f} s (1-token step {1e3 * one:.1f} ms)", flush=True)
    for temperature in temperatures:
      sampling = jaxspec.Sampling(temperature=temperature)
      contenders = [None] + list(variants)
      fns = {i: functools.partial(lambda s, b: jaxspec.generate(target, b, s, sampling, max_new_tokens=max_new_tokens),
                                  s) for i, s in enumerate(contenders)}
      passes, _ = timing.interleaved_passes(fns, batches, repeats)
      plain_tokens = None
      for i, spec in enumerate(contenders):
        outs = passes[i].outputs
        stats = jaxspec.DecodeStats.concatenate([o.stats.select(slice(0, n)) for o, n in zip(outs, real)])
        tokens = int(stats.generated.sum())
        ms = 1e3 * passes[i].median_s / max(tokens, 1)
        row = {"temperature": temperature, "batch": batch, "variant": _label(spec),
               "gamma": 0 if spec is None else spec.gamma,
               "tree": None if spec is None or spec.tree is None else [spec.tree.top_k, spec.tree.nodes],
               "tokens": tokens, "ms_per_token": ms, "tau": stats.tokens_per_iteration,
               "acceptance_per_depth": None if spec is None else stats.acceptance_per_position.tolist(),
               "compile_and_first_pass_s": passes[i].warmup_s, "compile_s": passes[i].compile_s,
               "median_pass_s": passes[i].median_s, "probe_s": probe_s}
        if spec is None:
          plain_ms, plain_tokens = ms, [o.tokens[:n] for o, n in zip(outs, real)]
          if keep_tokens and temperature == 0:
            row["token_ids"] = [o.tokens[k, :o.lengths[k]].tolist() for o, n in zip(outs, real) for k in range(n)]
        else:
          row["speedup"] = plain_ms / ms
          row["r"] = r_of[_label(spec) if spec.tree is not None else spec.gamma]
          if temperature == 0:
            row["identical_to_plain"] = all(np.array_equal(o.tokens[:n], p)
                                            for o, n, p in zip(outs, real, plain_tokens))
        rows.append(row)
        print(f"T={temperature} batch={batch} {row['variant']}: {ms:.2f} ms/token, tau {row['tau']:.2f}"
              + (f", r {row['r']:.2f}, {row['speedup']:.2f}x" if spec is not None else "")
              + f"; warm-up pass {passes[i].warmup_s:.1f} s (compilation {passes[i].compile_s:.1f} s), "
              f"median pass {passes[i].median_s:.1f} s", flush=True)
  return rows


def markdown(rows: list[dict], peer: list[dict], meta: dict) -> str:
  """The table of `compare`'s rows (and transformers' assisted rows, when given)."""
  lines = [f"Machine: {meta.get('machine')}; JAX {meta.get('jax')}; {meta.get('date')}.", "",
           f"Command: `{meta.get('command')}`", "",
           "Timed passes: medians after a warm-up pass; the warm-up pass (first pass) and JAX's compilation in it "
           "are the last two columns, never in ms/token.", "",
           "| T | batch | variant | tau | r(N) | ms/token | speedup | acceptance per depth | = plain | first pass s | "
           "compile s |",
           "| ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |"]
  for r in rows:
    acc = "" if r["acceptance_per_depth"] is None else " ".join(f"{a:.2f}" for a in r["acceptance_per_depth"])
    lines.append(f"| {r['temperature']:g} | {r['batch']} | {r['variant']} | {r['tau']:.2f} | "
                 f"{r.get('r', float('nan')):.2f} | {r['ms_per_token']:.2f} | {r.get('speedup', 1.0):.2f} | {acc} | "
                 f"{r.get('identical_to_plain', '')} | {r.get('compile_and_first_pass_s', float('nan')):.1f} | "
                 f"{r.get('compile_s', float('nan')):.1f} |")
  if peer:
    lines += ["", "transformers assisted generation on the same weights (float32, batch 1, temperature 0):", "",
              "| gamma | plain ms/token | assisted ms/token | speedup | tokens per target call | assisted = plain | "
              "plain = jaxspec plain |",
              "| ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for p in peer:
      if "error" in p:
        lines.append(f"| error: {p['error']} | | | | | | |")
      else:
        equal = p.get("plain_equals_jaxspec")
        same = "" if equal is None else f"{sum(equal)} of {len(equal)} inputs"
        lines.append(f"| {p['gamma']} | {p['plain_ms_per_token']:.2f} | {p['assisted_ms_per_token']:.2f} | "
                     f"{p['speedup']:.2f} | {p['tokens_per_target_call']:.2f} | "
                     f"{p.get('assisted_identical_to_plain', '')} | {same} |")
  if meta.get("stages_s"):
    lines += ["", "Wall time of the run: " + ", ".join(f"{k} {v:.0f} s" for k, v in meta["stages_s"].items()) + "."]
  return "\n".join(lines) + "\n"
