r"""What the decoding loop adds beyond the models: its wall time split by a profiler trace.

    python launch/loop_profile.py                                  # embedded pair, plain and gamma 1-4, 6, 8
    python launch/loop_profile.py --gammas=0,3 --sentences=8 --output=/tmp/profile

For plain decoding (gamma 0) and each gamma, decodes the same inputs (batch 1 by default) under `jax.profiler`
and splits the loop program's wall time into the target's kernels, the draft's kernels, the loop's own kernels
(verification, argmax / sampling, writes, counters) and idle time between kernels (dispatch, control flow);
see `jaxspec.profiling`. Everything is per iteration of the loop, so the model's share can be read directly:
(target + draft) / wall is what the models themselves cost, the rest is the implementation's. From the same
trace it takes c and r as the loop sees them (the target's time per iteration over the plain loop's, the draft's
per call over the plain loop's target step) and compares the loop's measured speedup (the loop program only,
encoders excluded) with Theorem 3.8 and with `expected_speedup_for_workload` at the measured alpha. Inputs are
the ones whose prompt falls into the most common length bucket (one compiled program per configuration).
Writes OUTPUT.json and OUTPUT.md.
"""

import collections
import json
import os
import platform
import time

import jax
from absl import app, flags

import jaxspec
from jaxspec import profiling
from jaxspec.data.ende import read_pairs
from jaxspec.decoding.engine import MAX_INPUT_LENGTH, bucket_length, compiled_loop_hlo

_TARGET = flags.DEFINE_string("target", "ende-target", "Target model (embedded name or directory).")
_DRAFT = flags.DEFINE_string("draft", "ende-draft", "Draft model (embedded name or directory).")
_INPUT = flags.DEFINE_string("input", "../shared/data/ende/dev.tsv", "EN-DE TSV ('en' column) or text file.")
_SENTENCES = flags.DEFINE_integer("sentences", 16, "Inputs profiled (natural sentences of a corpus TSV first).")
_GAMMAS = flags.DEFINE_list("gammas", ["0", "1", "2", "3", "4", "6", "8"], "Gammas; 0 is plain decoding.")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Rows decoded together.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0 = greedy).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens generated per input at most.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Profiles per configuration, interleaved across configurations.")
_OUT = flags.DEFINE_string("output", "docs/bench/loop_profile", "Writes OUTPUT.json and OUTPUT.md.")


def _texts():
  if _INPUT.value.endswith((".tsv", ".tsv.gz")):
    pairs = read_pairs(_INPUT.value)
    natural = [p for p in pairs if p.is_natural]
    return [p.en for p in (natural or pairs)]
  with open(_INPUT.value, encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


def main(argv):
  del argv
  target, draft = jaxspec.load(_TARGET.value), jaxspec.load(_DRAFT.value)
  ids = [target.tokenizer.encode(t) for t in _texts()]
  bucket = collections.Counter(bucket_length(len(i), MAX_INPUT_LENGTH) for i in ids).most_common(1)[0][0]
  ids = [i for i in ids if bucket_length(len(i), MAX_INPUT_LENGTH) == bucket][:_SENTENCES.value]
  batches = [ids[k:k + _BATCH.value] for k in range(0, len(ids) - _BATCH.value + 1, _BATCH.value)]
  gammas = [0] + [g for g in (int(x) for x in _GAMMAS.value) if g]  # plain first: the reference target step
  configs = {}
  for g in gammas:
    kw = dict(max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value)
    if g:
      kw.update(draft=draft, gamma=g)
    # Every batch has the same bucket, so one compiled program runs them all.
    hlo = compiled_loop_hlo(target, batches[0], **kw)
    outs = [jaxspec.generate(target, b, **kw) for b in batches]  # warm-up (and the iteration counts)
    configs[g] = (kw, hlo, outs)
  # Rounds of one profile per configuration, summed: slow spells of the machine fall on all of them alike.
  totals = {g: collections.Counter() for g in gammas}
  unmapped = {g: set() for g in gammas}
  for _ in range(_ROUNDS.value):
    for g, (kw, hlo, _) in configs.items():
      def decode(kw=kw):
        for b in batches:
          jaxspec.generate(target, b, **kw)
      parts = profiling.loop_time_breakdown(decode, hlo)
      unmapped[g].update(parts.pop("unmapped_instructions"))
      totals[g].update(parts)
  rows = []
  for g in gammas:
    outs = configs[g][2]
    parts = dict(totals[g], unmapped_instructions=sorted(unmapped[g]))
    iterations = _ROUNDS.value * sum(int(o.stats.iterations.max()) for o in outs)
    tokens = _ROUNDS.value * sum(int(o.lengths.sum()) for o in outs)
    per_iter = {c: 1e3 * parts[c] / iterations for c in profiling.CATEGORIES + ("wall",)}
    row = {"gamma": g, "iterations": iterations, "tokens": tokens, "executions": parts["executions"],
           "ms_per_iteration": per_iter, "ms_per_token": 1e3 * parts["wall"] / tokens,
           "model_share": (parts["target"] + parts["draft"]) / parts["wall"],
           "unmapped_instructions": parts["unmapped_instructions"]}
    if g:
      # The paper's quantities with the costs measured inside the loop, in this trace: a target step is the plain
      # loop's target time per iteration; c is the draft's time per call (gamma calls per iteration) over it.
      plain = rows[0]
      step = plain["ms_per_iteration"]["target"]
      stats = jaxspec.DecodeStats.concatenate([o.stats for o in outs])
      alpha = min(stats.alpha, 1.0)
      c, r = per_iter["draft"] / g / step, per_iter["target"] / step
      lengths = [o.lengths.tolist() for o in outs]
      exp_r = jaxspec.expected_speedup(alpha, g, c, r)
      exp_work = jaxspec.expected_speedup_for_workload(lengths, alpha, g, c, r)
      speedup = plain["ms_per_token"] / row["ms_per_token"]
      row.update(alpha=stats.alpha, tokens_per_iteration=stats.tokens_per_iteration, c_in_loop=c, r_in_loop=r,
                 loop_speedup=speedup, expected_speedup_with_r=exp_r, measured_over_expected=speedup / exp_r,
                 expected_speedup_workload=exp_work, measured_over_expected_workload=speedup / exp_work)
    rows.append(row)
    print(f"gamma {g}: {iterations} iterations, wall {per_iter['wall']:.3f} ms/iteration = target "
          f"{per_iter['target']:.3f} + draft {per_iter['draft']:.3f} + loop {per_iter['loop']:.3f} + idle "
          f"{per_iter['idle']:.3f}; models' share {row['model_share']:.3f}"
          + (f"; loop speedup {row['loop_speedup']:.2f}x, expected {row['expected_speedup_workload']:.2f}x"
             if g else ""), flush=True)
  meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "jax": jax.__version__,
          "backend": jax.default_backend(), "target": repr(target), "draft": repr(draft), "inputs": len(ids),
          "prompt_bucket": bucket, "rounds": _ROUNDS.value, "batch_size": _BATCH.value,
          "temperature": _TEMPERATURE.value, "date": time.strftime("%Y-%m-%d")}
  lines = [f"Machine: {meta['machine']}; JAX {meta['jax']} on {meta['backend']}; target {meta['target']}; draft "
           f"{meta['draft']}; {len(ids)} inputs (prompt bucket {bucket}), batch {_BATCH.value}, temperature "
           f"{_TEMPERATURE.value:g}; {_ROUNDS.value} profiles per configuration, interleaved.", "",
           "| gamma | iterations | wall ms/iter | target | draft | loop kernels | idle | models' share | ms/token "
           "| alpha | tok/iter | c in loop | r in loop | loop speedup | Exp (r) | meas/exp | Exp (workload) "
           "| meas/exp workload |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    p = r["ms_per_iteration"]
    spec = (f"{r['alpha']:.2f} | {r['tokens_per_iteration']:.2f} | {r['c_in_loop']:.3f} | {r['r_in_loop']:.2f} | "
            f"{r['loop_speedup']:.2f}x | {r['expected_speedup_with_r']:.2f} | {r['measured_over_expected']:.2f} | "
            f"{r['expected_speedup_workload']:.2f} | {r['measured_over_expected_workload']:.2f}") if r["gamma"] \
        else " | | | | | | | | "
    lines.append(f"| {r['gamma'] or 'plain'} | {r['iterations']} | {p['wall']:.3f} | {p['target']:.3f} | "
                 f"{p['draft']:.3f} | {p['loop']:.3f} | {p['idle']:.3f} | {r['model_share']:.3f} | "
                 f"{r['ms_per_token']:.3f} | {spec} |")
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value + ".json", "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=2)
  with open(_OUT.value + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
