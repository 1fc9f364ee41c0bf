"""Reports of the benchmark sweep (results.json, results.md, speedup.png), of the tuner (tune.json, tune.md,
speedup_vs_gamma.png, acceptance.png) and the speed summary of translate.py and generate.py. Tables are markdown
with every column padded to its widest cell (`jaxspec.tools.outputs`)."""

from __future__ import annotations

import math
import os

import jaxspec
from jaxspec.bench import costs
from jaxspec.tools.outputs import atomic_write, atomic_write_json, markdown_table

BENCH_HEADER = ["Temp", "Batch", "gamma", "alpha", "tok/iter", "c", "c alt", "r", "plain ms/tok", "spec ms/tok",
                "Speedup", "Exp", "Exp (r)", "meas/exp", "Exp (workload)", "meas/exp workload", "meas/cost model",
                "p50 / p90 / p99 s"]


def recommend(rows: list[dict]) -> dict:
  """{(temperature, batch): (gamma, speedup)}: the measured fastest gamma of each (temperature, batch)."""
  best = {}
  for r in rows:
    key = (r["temperature"], r["batch"])
    if key not in best or r["speedup"] > best[key][1]:
      best[key] = (r["gamma"], r["speedup"])
  return best


def markdown(rows: list[dict], peer: list[dict], meta: dict) -> str:
  """The paper's Table 2 form, then jaxspec next to transformers, then the recommended gammas."""
  table = []
  for r in rows:
    lat = r["spec_latency_s"]
    table.append([f"{r['temperature']:g}", r["batch"], r["gamma"], f"{r['alpha']:.2f}",
                  f"{r['tokens_per_iteration']:.2f}", f"{r['c']:.3f}", f"{r['c_alternating']:.3f}", f"{r['r']:.2f}",
                  f"{r['plain_ms_per_token']:.2f}", f"{r['spec_ms_per_token']:.2f}", f"{r['speedup']:.2f}x",
                  f"{r['expected_speedup']:.2f}", f"{r['expected_speedup_with_r']:.2f}",
                  f"{r['measured_over_expected']:.2f}", f"{r['expected_speedup_workload']:.2f}",
                  f"{r['measured_over_expected_workload']:.2f}", f"{r['measured_over_cost_model']:.2f}",
                  f"{lat['p50']:.3f} / {lat['p90']:.3f} / {lat['p99']:.3f}"])
  lines = [f"Machine: {meta['machine']}; JAX {meta['jax']} on {meta['backend']}; target {meta['target']}; "
           f"draft {meta['draft']}; {meta['sentences']} inputs; medians of {meta['repeats']} passes.", ""]
  lines += markdown_table(BENCH_HEADER, table)
  if peer:
    lines += [""] + peer_markdown(rows, peer)
  lines += [""] + [f"Recommended gamma at temperature {t:g}, batch {b}: {g} (measured {s:.2f}x)"
                   for (t, b), (g, s) in sorted(recommend(rows).items())]
  return "\n".join(lines) + "\n"


def peer_markdown(rows: list[dict], peer: list[dict]) -> list[str]:
  """jaxspec next to transformers (`jaxspec.bench.peer`) at batch 1, temperature 0, constant schedule, per gamma:
  ms per token, speedups, tokens per target call; then greedy exactness."""
  lines = ["Side by side with transformers (batch 1, temperature 0, same weights, same inputs):", ""]
  if "error" in peer[0]:
    return lines + [f"transformers failed: {peer[0]['error']}"]
  jax_b1 = {r["gamma"]: r for r in rows if (r["batch"], r["temperature"], r["schedule"]) == (1, 0, "constant")}
  lines += markdown_table(
      ["gamma", "jaxspec plain ms/tok", "jaxspec spec ms/tok", "jaxspec speedup", "jaxspec tok/iter",
       "transformers plain ms/tok", "transformers assisted ms/tok", "transformers speedup",
       "transformers tok/call", "jaxspec spec / transformers assisted"],
      [[p["gamma"], f"{j['plain_ms_per_token']:.2f}", f"{j['spec_ms_per_token']:.2f}", f"{j['speedup']:.2f}x",
        f"{j['tokens_per_iteration']:.2f}", f"{p['plain_ms_per_token']:.2f}", f"{p['assisted_ms_per_token']:.2f}",
        f"{p['speedup']:.2f}x", f"{p['tokens_per_target_call']:.2f}",
        f"{j['spec_ms_per_token'] / p['assisted_ms_per_token']:.2f}"] for p in peer if (j := jax_b1.get(p["gamma"]))])
  equal = peer[0].get("plain_equals_jaxspec")
  lines += ["", "Greedy exactness (token ids of every input): jaxspec speculative == jaxspec plain: "
            + ", ".join(f"gamma {g} {j['identical_to_plain']}" for g, j in sorted(jax_b1.items()))
            + "; transformers assisted == transformers plain: "
            + ", ".join(f"gamma {p['gamma']} {p['assisted_identical_to_plain']}" for p in peer)
            + "; transformers plain == jaxspec plain: "
            + ("not compared" if equal is None else f"{sum(equal)} of {len(equal)} inputs")]
  return lines


def plot(path: str, rows: list[dict]) -> None:
  """Measured speedup and Theorem 3.8's (with r) against gamma, one line pair per (temperature, batch)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for (temp, batch) in sorted({(r["temperature"], r["batch"]) for r in rows}):
    sel = sorted((r for r in rows if (r["temperature"], r["batch"]) == (temp, batch)), key=lambda r: r["gamma"])
    g = [r["gamma"] for r in sel]
    line, = ax.plot(g, [r["speedup"] for r in sel], "o-", label=f"measured, T={temp:g}, batch {batch}")
    ax.plot(g, [r["expected_speedup_with_r"] for r in sel], "--", color=line.get_color(),
            label=f"Theorem 3.8 with r, T={temp:g}, batch {batch}")
  ax.axhline(1.0, color="gray", lw=0.8)
  ax.set_xlabel("gamma")
  ax.set_ylabel("speedup over plain decoding")
  ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_benchmark(out_dir: str, rows: list[dict], peer: list[dict], meta: dict) -> dict[str, str]:
  """Writes results.json, results.md and speedup.png into out_dir; returns {kind: path}."""
  paths = {k: os.path.join(out_dir, f) for k, f in (("json", "results.json"), ("markdown", "results.md"),
                                                    ("plot", "speedup.png"))}
  os.makedirs(out_dir, exist_ok=True)
  atomic_write_json(paths["json"], {"meta": meta, "jaxspec": rows, "transformers": peer, "recommended_gamma": {
      f"T={t:g},batch={b}": g for (t, b), (g, _) in recommend(rows).items()}}, indent=2)
  atomic_write(paths["markdown"], markdown(rows, peer, meta))
  plot(paths["plot"], rows)
  return paths


TUNE_HEADER = ["Temp", "Batch", "draft", "schedule", "gamma", "alpha", "tau", "tok/iter", "drafted", "rest",
               "accept per position", "c", "r", "draft ms/tok", "plain ms/tok", "spec ms/tok", "tok/s", "Speedup",
               "Exp (r)", "seq p50 / p90 / p99 s", "ITL p50 / p90 / p99 ms", "BLEU / chrF"]


def _cells(stats: dict | None, fmt: str, keys=("p50", "p90", "p99")) -> str:
  return " / ".join(format(stats[k], fmt) for k in keys) if stats else "-"


def _speedup_cell(r: dict) -> str:
  """'1.20x +- 0.04' (the spread of the per-round speedups, with more than one round); a row that drafted nothing
  decoded plainly, whatever its timing: '1.46x (drafted nothing: plain)'."""
  if not r.get("mean_draft_length", 1.0) > 0:
    return f"{r['speedup']:.2f}x (drafted nothing: plain)"
  spread = f" +- {r['speedup_spread']:.2f}" if r.get("rounds", 0) > 1 else ""
  return f"{r['speedup']:.2f}x{spread}"


def tune_table(rows: list[dict]) -> list[str]:
  """The tuner's rows in the benchmark's form, with the draft, schedule, latency and quality columns."""
  table = []
  for r in rows:
    q = r.get("quality")
    table.append([f"{r['temperature']:g}", r["batch"], r["draft"], r["schedule"], r["gamma"], f"{r['alpha']:.2f}",
                  f"{r['tau']:.2f}", f"{r['tokens_per_iteration']:.2f}", f"{r['mean_draft_length']:.2f}",
                  f"{100 * r['fallback_share']:.0f}%",
                  " ".join("-" if x != x else f"{x:.2f}" for x in r["acceptance_per_position"]),
                  f"{max(r['c'], r['c_alternating']):.3f}", f"{r['r']:.2f}", f"{r['draft_step_ms']:.3f}",
                  f"{r['plain_ms_per_token']:.2f}", f"{r['spec_ms_per_token']:.2f}", f"{r['spec_tokens_per_s']:.0f}",
                  _speedup_cell(r), f"{r['expected_speedup_with_r']:.2f}", _cells(r["spec_latency_s"], ".3f"),
                  _cells(r.get("spec_itl_ms"), ".1f"), f"{q['bleu']:.2f} / {q['chrf']:.1f}" if q else "-"])
  return markdown_table(TUNE_HEADER, table)


def tune_markdown(result) -> str:
  """tune.md: how it was measured, the table, plain decoding's own numbers and the choice per (temperature, batch)."""
  m = result.meta
  lines = [f"Machine: {m['machine']}; JAX {m['jax']} on {m['backend']}; load average {m['load_average_before_after']}"
           f" (before / after); target {m['target']}; drafts {m['drafts']}; {m['inputs']} inputs, at most "
           f"{m['max_new_tokens']} new tokens; medians of {m['repeats']} interleaved passes; {m['date']}.", "",
           "c is the larger of the isolated and the alternating draft step (what the loop pays), relative to a "
           "target step; drafted = mean draft tokens per iteration; rest = share of iterations decoded plainly "
           "(fallback); tau = accepted draft tokens per iteration; ITL = time between a row's token deliveries.",
           ""] + tune_table(result.rows) + [""]
  plain = {(r["temperature"], r["batch"]): r for r in result.rows}
  lines += markdown_table(
      ["Temp", "Batch", "plain ms/tok", "plain tok/s", "plain seq p50 / p90 / p99 s", "plain ITL ms", "BLEU / chrF"],
      [[f"{t:g}", b, f"{r['plain_ms_per_token']:.2f}", f"{r['plain_tokens_per_s']:.0f}",
        _cells(r["plain_latency_s"], ".3f"), _cells(r.get("plain_itl_ms"), ".1f"),
        f"{r['plain_quality']['bleu']:.2f} / {r['plain_quality']['chrf']:.1f}" if r.get("plain_quality") else "-"]
       for (t, b), r in sorted(plain.items())])
  lines += [""] + [f"Best at temperature {t:g}, batch {b}: {c.describe()} ({c.why})"
                   for (t, b), c in sorted(result.best.items())]
  return "\n".join(lines) + "\n"


def _groups(rows: list[dict], keys: tuple[str, ...]) -> dict:
  out = {}
  for r in rows:
    out.setdefault(tuple(r[k] for k in keys), []).append(r)
  return out


def tune_plots(out_dir: str, rows: list[dict]) -> dict[str, str]:
  """speedup_vs_gamma.png (per (temperature, batch): measured speedup per draft and schedule, Theorem 3.8 with r
  dashed) and acceptance.png (per (temperature, batch): acceptance per position at each draft's largest constant
  gamma). Returns {kind: path}."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  panels = sorted(_groups(rows, ("temperature", "batch")).items())
  paths = {"speedup_plot": os.path.join(out_dir, "speedup_vs_gamma.png"),
           "acceptance_plot": os.path.join(out_dir, "acceptance.png")}
  for kind, path in paths.items():
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, ((temp, batch), group) in zip(axes[0], panels):
      for (draft, schedule), sel in sorted(_groups(group, ("draft", "schedule")).items()):
        sel = sorted(sel, key=lambda r: r["gamma"])
        if kind == "speedup_plot":
          line, = ax.plot([r["gamma"] for r in sel], [r["speedup"] for r in sel], "o-", label=f"{draft} {schedule}")
          if schedule == "constant":
            ax.plot([r["gamma"] for r in sel], [r["expected_speedup_with_r"] for r in sel], "--",
                    color=line.get_color(), label=f"{draft}: Theorem 3.8 with r")
        elif schedule == "constant":
          acc = sel[-1]["acceptance_per_position"]
          ax.plot(range(1, len(acc) + 1), acc, "o-", label=f"{draft} (gamma {sel[-1]['gamma']})")
      if kind == "speedup_plot":
        ax.axhline(1.0, color="gray", lw=0.8)
      ax.set_title(f"T={temp:g}, batch {batch}", fontsize=9)
      ax.set_xlabel("gamma" if kind == "speedup_plot" else "draft position")
      ax.set_ylabel("speedup over plain decoding" if kind == "speedup_plot" else "fraction accepted")
      ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
  return paths


TUNE_FILES = ("tune.json", "tune.md", "speedup_vs_gamma.png", "acceptance.png")  # what write_tune writes


def write_tune(out_dir: str, result) -> dict[str, str]:
  """Writes tune.json, tune.md and the plots into out_dir; returns {kind: path}."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {"json": os.path.join(out_dir, "tune.json"), "markdown": os.path.join(out_dir, "tune.md")}
  atomic_write_json(paths["json"], result.to_json(), indent=1)
  atomic_write(paths["markdown"], tune_markdown(result))
  return {**paths, **tune_plots(out_dir, result.rows)}


def _costs(target, draft, gamma: int, batch: int) -> dict:
  """c, r and c_alternating for the summary (a feature head's from its own steps); an n-gram drafter costs
  nothing (c = 0)."""
  if isinstance(draft, (jaxspec.Model, jaxspec.FeatureHead)):
    return costs.cost_ratios(target, draft, gamma, batch=batch)
  r = costs.decoder_step_time(target, batch, gamma + 1) / costs.decoder_step_time(target, batch, 1)
  return {"c": 0.0, "r": r, "c_alternating": 0.0}


def speed_summary(run, target, speculation: jaxspec.Speculation | None, sampling: jaxspec.Sampling,
                  batch_size: int) -> list[str]:
  """Lines of translate.py's / generate.py's summary of a `batching.generate_all` run (compare=True for speeds)."""
  stats, temperature = run.stats, sampling.temperature
  draft, gamma = (None, 0) if speculation is None else (speculation.draft, speculation.gamma)
  lines = [f"== summary: {int(stats.generated.sum())} tokens, batch {batch_size}, temperature {temperature} ==",
           "compile + first call, summed over the prompt-length buckets seen: "
           + ", ".join(f"{k} {v:.1f} s" for k, v in run.compile_s.items())]
  if draft is None:
    return lines + [f"plain decoding: {run.ms_per_token('plain'):.2f} ms/token"]
  alpha, a = stats.alpha, min(stats.alpha, 1.0)
  accept = " ".join("n/a" if math.isnan(x) else f"{x:.2f}" for x in stats.acceptance_per_position)
  shown = "n/a (no draft token was verified)" if math.isnan(alpha) else f"{alpha:.3f}"
  lines += [f"gamma {gamma} | alpha {shown} | tokens per iteration {stats.tokens_per_iteration:.2f} (bonus token "
            "included)", f"acceptance per draft position: {accept}",
            f"speculative: {run.ms_per_token('speculative'):.2f} ms/token"]
  if not run.seconds["plain"]:
    return lines
  plain_ms, spec_ms = run.ms_per_token("plain"), run.ms_per_token("speculative")
  lines.append(f"plain:       {plain_ms:.2f} ms/token")
  if math.isnan(alpha):  # nothing was verified: every iteration rested (fallback) or no lookup matched
    lines.append(f"speedup {plain_ms / spec_ms:.2f}x measured | no draft token was verified (the batch rested "
                 "or prompt lookup found nothing): no alpha, no Theorem 3.8 prediction")
  else:
    costs = _costs(target, draft, gamma, batch_size)
    expected = jaxspec.expected_speedup(a, gamma, costs["c"], costs["r"])
    lines += [
        f"speedup {plain_ms / spec_ms:.2f}x measured | expected {expected:.2f}x from Theorem 3.8 with the "
        f"measured alpha {alpha:.2f}, c {costs['c']:.3f}, r {costs['r']:.2f} "
        f"({jaxspec.expected_speedup(a, gamma, costs['c']):.2f}x if r were 1); "
        f"{jaxspec.expected_speedup(a, gamma, costs['c_alternating'], costs['r']):.2f}x with the draft's cost "
        f"between target calls (c {costs['c_alternating']:.3f})"]
  if temperature == 0:
    lines.append(f"temperature 0: speculative output identical to plain greedy output: {run.identical}")
  return lines
