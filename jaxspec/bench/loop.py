"""What the decoding loop adds beyond the models: its wall time per iteration split by profiler traces.

For plain decoding (gamma 0) and each gamma, decodes the same inputs under `jax.profiler` and splits the loop
program's wall time into the target's kernels, the draft's, the loop's own (verification, sampling, writes,
counters) and idle time (`jaxspec.bench.profiling.loop_time_breakdown`). From the same traces: c and r as the loop sees
them (the target's time per iteration over the plain loop's; the draft's per call over the plain loop's target
step), and the loop's measured speedup (encoders excluded) next to Theorem 3.8 and
`expected_speedup_for_workload` at the measured alpha. Only inputs of the most common prompt-length bucket are
used, so one compiled program runs each configuration.
"""

from __future__ import annotations

import collections
from typing import Sequence

import jaxspec
from jaxspec.bench import profiling
from jaxspec.decoding.arguments import bucket_length
from jaxspec.decoding.generation import MAX_INPUT_LENGTH
from jaxspec.tools.outputs import markdown_table, progress

HEADER = ["gamma", "iterations", "wall ms/iter", "target", "draft", "loop kernels", "idle", "models' share",
          "ms/token", "alpha", "tok/iter", "c in loop", "r in loop", "loop speedup", "Exp (r)", "meas/exp",
          "Exp (workload)", "meas/exp workload"]


def common_bucket(ids: Sequence[list[int]], limit: int) -> tuple[int, list[list[int]]]:
  """The most common prompt bucket and (at most `limit` of) the inputs that fall into it."""
  bucket = collections.Counter(bucket_length(len(i), MAX_INPUT_LENGTH) for i in ids).most_common(1)[0][0]
  return bucket, [i for i in ids if bucket_length(len(i), MAX_INPUT_LENGTH) == bucket][:limit]


def _row(g, parts, outs, rounds, plain):
  iterations = rounds * sum(int(o.stats.iterations.max()) for o in outs)
  tokens = rounds * sum(int(o.lengths.sum()) for o in outs)
  per_iter = {c: 1e3 * parts[c] / iterations for c in profiling.CATEGORIES + ("wall",)}
  row = {"gamma": g, "iterations": iterations, "tokens": tokens, "executions": parts["executions"],
         "ms_per_iteration": per_iter, "ms_per_token": 1e3 * parts["wall"] / tokens,
         "model_share": (parts["target"] + parts["draft"]) / parts["wall"],
         "unmapped_instructions": parts["unmapped_instructions"]}
  if g:
    # The paper's quantities with the costs measured inside the loop, in this trace: a target step is the plain
    # loop's target time per iteration; c is the draft's time per call (gamma calls per iteration) over it.
    step = plain["ms_per_iteration"]["target"]
    stats = jaxspec.DecodeStats.concatenate([o.stats for o in outs])
    alpha = min(stats.alpha, 1.0)
    c, r = per_iter["draft"] / g / step, per_iter["target"] / step
    exp_r = jaxspec.expected_speedup(alpha, g, c, r)
    exp_work = jaxspec.expected_speedup_for_workload([o.lengths.tolist() for o in outs], alpha, g, c, r)
    speedup = plain["ms_per_token"] / row["ms_per_token"]
    row.update(alpha=stats.alpha, tokens_per_iteration=stats.tokens_per_iteration, c_in_loop=c, r_in_loop=r,
               loop_speedup=speedup, expected_speedup_with_r=exp_r, measured_over_expected=speedup / exp_r,
               expected_speedup_workload=exp_work, measured_over_expected_workload=speedup / exp_work)
  return row


def profile_sweep(target, draft, batches: list[list[list[int]]], gammas: Sequence[int], rounds: int,
                  sampling: jaxspec.Sampling | None = None, max_new_tokens: int = 64) -> list[dict]:
  """One row per gamma (0 = plain, always first: the reference target step); see the module docstring."""
  gammas = [0] + [g for g in gammas if g]
  configs = {}
  for g in gammas:
    kw = dict(speculation=jaxspec.Speculation(draft, gamma=g) if g else None, sampling=sampling,
              max_new_tokens=max_new_tokens)
    hlo = jaxspec.lower(target, batches[0], **kw).loop_hlo()  # Every batch has the same bucket: one program.
    configs[g] = (kw, hlo, [jaxspec.generate(target, b, **kw) for b in batches])  # Warm-up, iteration counts.
  # Rounds of one profile per configuration, summed: slow spells of the machine fall on all of them alike.
  totals = {g: collections.Counter() for g in gammas}
  unmapped = {g: set() for g in gammas}
  bar = progress(rounds * len(gammas), "loop profile", unit="profile")
  for _ in range(rounds):
    for g, (kw, hlo, _) in configs.items():
      def decode(kw=kw):
        for b in batches:
          jaxspec.generate(target, b, **kw)
      parts = profiling.loop_time_breakdown(decode, hlo)
      unmapped[g].update(parts.pop("unmapped_instructions"))
      totals[g].update(parts)
      bar.update(1)
  bar.close()
  rows = []
  for g in gammas:
    parts = dict(totals[g], unmapped_instructions=sorted(unmapped[g]))
    rows.append(_row(g, parts, configs[g][2], rounds, rows[0] if rows else None))
    p = rows[-1]["ms_per_iteration"]
    print(f"gamma {g}: {rows[-1]['iterations']} iterations, wall {p['wall']:.3f} ms/iteration = target "
          f"{p['target']:.3f} + draft {p['draft']:.3f} + loop {p['loop']:.3f} + idle {p['idle']:.3f}; models' share "
          f"{rows[-1]['model_share']:.3f}" + (f"; loop speedup {rows[-1]['loop_speedup']:.2f}x, expected "
                                             f"{rows[-1]['expected_speedup_workload']:.2f}x" if g else ""), flush=True)
  return rows


def table(rows: list[dict]) -> list[str]:
  out = []
  for r in rows:
    p = r["ms_per_iteration"]
    spec = ([f"{r['alpha']:.2f}", f"{r['tokens_per_iteration']:.2f}", f"{r['c_in_loop']:.3f}", f"{r['r_in_loop']:.2f}",
             f"{r['loop_speedup']:.2f}x", f"{r['expected_speedup_with_r']:.2f}", f"{r['measured_over_expected']:.2f}",
             f"{r['expected_speedup_workload']:.2f}", f"{r['measured_over_expected_workload']:.2f}"]
            if r["gamma"] else [""] * 9)
    out.append([r["gamma"] or "plain", r["iterations"], f"{p['wall']:.3f}", f"{p['target']:.3f}", f"{p['draft']:.3f}",
                f"{p['loop']:.3f}", f"{p['idle']:.3f}", f"{r['model_share']:.3f}", f"{r['ms_per_token']:.3f}"] + spec)
  return markdown_table(HEADER, out)
