r"""Benchmarks plain vs speculative decoding the way the paper reports it, next to transformers.

    python launch/benchmark.py                                   # embedded pair, full sweep, writes docs/bench/
    python launch/benchmark.py --gammas=1,2,3 --temperatures=0 --batch_sizes=1 --sentences=8 --repeats=1
    python launch/benchmark.py --target=/ckpt/t5-11b --draft=/ckpt/t5-small \
        --input=newstest2014.en --prefix="translate English to German: " --gammas=7 --peer=false
    python launch/benchmark.py --paper=configs/paper_t5.py:ende_small_t0 --paper.checkpoint_dir=/mnt/disks/t5

For every (temperature, batch size, gamma) it measures alpha, tokens per iteration, acceptance per draft
position, wall time per generated token of plain and speculative decoding (medians over --repeats passes after
a warm-up pass that includes compilation, timed separately), latency percentiles per sequence, the speedup, and
the speedup Theorem 3.8 predicts with and without the measured verify-cost ratio r, and the same model applied
to the workload actually run (`jaxspec.expected_speedup_for_workload`: sequences end, batches wait for their
slowest row, encoders run once per call). c, r and the encoders' times are timed in isolation, once in every
round of passes (medians over rounds); c also with the draft's steps between target calls (`c alt`). With
--peer, the same weights exported to Hugging Face format run through transformers'
`generate(assistant_model=...)` (constant schedule, same gamma, batch 1, greedy) and its plain greedy
`generate`, on the same inputs in the same run. Output: JSON, a markdown table (the paper's Table 2 form) and a
PNG of speedup against gamma.
"""

import json
import os
import platform
import tempfile
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

import jaxspec
from jaxspec import benchmarking
from jaxspec.data.ende import read_pairs
from jaxspec.decoding.engine import MAX_INPUT_LENGTH, bucket_length

_TARGET = flags.DEFINE_string("target", "ende-target", "Target model (embedded name or directory).")
_DRAFT = flags.DEFINE_string("draft", "ende-draft", "Draft model (embedded name or directory).")
_INPUT = flags.DEFINE_string("input", "../shared/data/ende/dev.tsv",
                             "Text file (one input a line) or EN-DE TSV (its 'en' column).")
_TOKEN_IDS = flags.DEFINE_boolean("input_is_token_ids", False, "The input file holds space-separated token ids "
                                  "(for models without a tokenizer).")
_NATURAL = flags.DEFINE_boolean("natural_only", True, "From a corpus TSV, keep the natural sentences only.")
_PREFIX = flags.DEFINE_string("prefix", "", "Text put before each input (T5's task prefix).")
_SENTENCES = flags.DEFINE_integer("sentences", 32, "Inputs used (the first N).")
_GAMMAS = flags.DEFINE_list("gammas", [str(g) for g in range(1, 9)], "Gammas to sweep.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Temperatures to sweep.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "4", "16"], "Batch sizes to sweep.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed passes per point (the median is reported).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens generated per input at most.")
_PEER = flags.DEFINE_boolean("peer", True, "Also run transformers' assisted generation on the same weights.")
_PAPER = config_flags.DEFINE_config_file("paper", None, "A row of configs/paper_t5.py: sets the target, draft, "
                                          "input, prefix, gamma, temperature and batch size of the paper's setup.")
_OUT = flags.DEFINE_string("output_dir", "docs/bench", "Where results.json, results.md and speedup.png go.")


def _inputs(model):
  if _INPUT.value.endswith((".tsv", ".tsv.gz")):
    pairs = read_pairs(_INPUT.value)
    if _NATURAL.value and any(p.is_natural for p in pairs):
      pairs = [p for p in pairs if p.is_natural]
    texts = [p.en for p in pairs]
  else:
    with open(_INPUT.value, encoding="utf-8") as f:
      texts = [line.strip() for line in f if line.strip()]
  texts = texts[:_SENTENCES.value]
  if _TOKEN_IDS.value:
    return [[int(t) for t in line.split()] + [model.config.eos_token_id] for line in texts]
  if model.tokenizer is None:
    raise SystemExit(f"{_TARGET.value} has no tokenizer: pass --input_is_token_ids with a file of token ids.")
  return [model.tokenizer.encode(_PREFIX.value + t) for t in texts]


def _interleaved_passes(fns: dict, batches, repeats, probe=None):
  """Times several decoders side by side: one warm-up pass each (compilation included, timed apart), then
  `repeats` rounds in which every decoder runs one pass over all batches, in turn. Interleaving keeps slow drifts
  of the machine (frequency, neighbours) out of the ratios. `probe`, if given, runs once per round too (the
  isolated cost measurements), so the costs that predict a speedup are timed in the same minutes as the passes.

  Returns ({name: (warmup_s, median pass seconds, per-call latencies of that pass, outputs of the warm-up pass)},
  [probe() of each round]).
  """
  first, outs, passes, probes = {}, {}, {name: [] for name in fns}, []
  if probe is not None:
    probe()  # compiles the timing programs
  for name, fn in fns.items():
    t0 = time.perf_counter()
    outs[name] = [fn(b) for b in batches]
    first[name] = time.perf_counter() - t0
  for _ in range(repeats):
    if probe is not None:
      probes.append(probe())
    for name, fn in fns.items():
      lat = []
      for b in batches:
        s = time.perf_counter()
        fn(b)
        lat.append(time.perf_counter() - s)
      passes[name].append((sum(lat), lat))
  result = {}
  for name, runs in passes.items():
    runs.sort(key=lambda p: p[0])
    total, lat = runs[len(runs) // 2]
    result[name] = (first[name], total, lat, outs[name])
  return result, probes


def _median_tree(trees):
  """Leafwise median of a list of same-shaped nested dicts / tuples of numbers."""
  return jax.tree.map(lambda *xs: float(np.median(xs)), *trees)


def _batches(ids, batch):
  out = []
  for k in range(0, len(ids), batch):
    chunk = ids[k:k + batch]
    out.append(chunk + [chunk[-1]] * (batch - len(chunk)))
  return out


def _pct(lat):
  return {f"p{q}": float(np.percentile(lat, q)) for q in (50, 90, 99)}


def run_jaxspec(target, draft, ids, gammas, temperatures, batch_sizes, repeats, max_new):
  rows = []
  for batch in batch_sizes:
    batches = _batches(ids, batch)
    # The work each call does once, outside the loop (the encoders), per prompt-length bucket.
    buckets = [bucket_length(max(len(r) for r in b), MAX_INPUT_LENGTH) for b in batches]

    def probe():
      """c and r (one interleaved round of `cost_table`) and the encoders' times, all in isolation."""
      return {"costs": benchmarking.cost_table(target, draft, gammas, batch=batch, rounds=1),
              "encoder_s": {n: (benchmarking.encoder_time(target, batch, n), benchmarking.encoder_time(draft, batch, n))
                            for n in sorted(set(buckets))}}

    for temp in temperatures:
      kw = dict(max_new_tokens=max_new, temperature=temp, seed=0)
      fns = {"plain": lambda b: jaxspec.generate(target, b, **kw)}
      fns.update({g: (lambda b, g=g: jaxspec.generate(target, b, draft=draft, gamma=g, **kw)) for g in gammas})
      timed, probes = _interleaved_passes(fns, batches, repeats, probe)
      measured = _median_tree(probes)
      costs, encoder_s = measured["costs"], measured["encoder_s"]
      for g in gammas:  # ratios of the medians, not medians of the per-round ratios
        cg = costs[g]
        cg.update(c=cg["draft_step_s"] / cg["target_step_s"], r=cg["target_verify_s"] / cg["target_step_s"],
                  c_alternating=cg["draft_step_alternating_s"] / cg["target_step_s"])
      t1 = costs[gammas[0]]["target_step_s"]
      fixed_plain = [encoder_s[n][0] / t1 for n in buckets]
      fixed_spec = [(encoder_s[n][0] + encoder_s[n][1]) / t1 for n in buckets]
      first, plain_s, plain_lat, plain_out = timed["plain"]
      plain_tokens = sum(int(o.lengths.sum()) for o in plain_out)
      for g in gammas:
        sfirst, spec_s, spec_lat, spec_out = timed[g]
        tokens = sum(int(o.lengths.sum()) for o in spec_out)
        stats = jaxspec.DecodeStats.concatenate([o.stats for o in spec_out])
        alpha = stats.alpha
        c, r = costs[g]["c"], costs[g]["r"]
        plain_ms, spec_ms = 1e3 * plain_s / plain_tokens, 1e3 * spec_s / tokens
        speedup = plain_ms / spec_ms
        exp_r = jaxspec.expected_speedup(min(alpha, 1.0), g, c, r)
        c_alt = costs[g]["c_alternating"]
        exp_alt = jaxspec.expected_speedup(min(alpha, 1.0), g, c_alt, r)
        exp_work = jaxspec.expected_speedup_for_workload([o.lengths.tolist() for o in spec_out], min(alpha, 1.0),
                                                         g, c_alt, r, fixed_plain, fixed_spec)
        row = {"temperature": temp, "batch": batch, "gamma": g, "alpha": alpha,
               "tokens_per_iteration": stats.tokens_per_iteration,
               "acceptance_per_position": stats.acceptance_per_position.tolist(),
               "c": c, "r": r, "target_step_ms": 1e3 * costs[g]["target_step_s"],
               "draft_step_ms": 1e3 * costs[g]["draft_step_s"], "plain_ms_per_token": plain_ms,
               "spec_ms_per_token": spec_ms, "speedup": speedup,
               "expected_speedup": jaxspec.expected_speedup(min(alpha, 1.0), g, c),
               "expected_speedup_with_r": exp_r, "measured_over_expected": speedup / exp_r,
               # The draft's cost when it runs between target calls (what the loop does; on a CPU the target's
               # pass evicts the draft's weights from the caches):
               "c_alternating": c_alt,
               "expected_speedup_with_r_alternating": exp_alt, "measured_over_expected_alternating": speedup / exp_alt,
               # That cost model fed the MEASURED tokens per iteration instead of alpha's i.i.d. prediction: what
               # is left between this and the measurement is the loop's own overhead.
               "cost_model_speedup": stats.tokens_per_iteration / (g * c_alt + r),
               # Theorem 3.8's model on the workload actually run (still from alpha, c alt and r alone): each
               # sequence's last iteration cut at EOS, a batch waiting for its slowest row, and the encoders
               # (timed in isolation per prompt bucket) paid once per call by both decoders.
               "encoder_ms_per_call": {str(n): [1e3 * e for e in v] for n, v in encoder_s.items()},
               "expected_speedup_workload": exp_work, "measured_over_expected_workload": speedup / exp_work,
               "measured_over_cost_model": speedup * (g * c_alt + r) / stats.tokens_per_iteration,
               "plain_compile_and_first_pass_s": first, "spec_compile_and_first_pass_s": sfirst,
               "plain_latency_s": _pct(plain_lat), "spec_latency_s": _pct(spec_lat),
               "identical_to_plain": bool(all(np.array_equal(a.tokens, b.tokens)
                                              for a, b in zip(plain_out, spec_out))) if temp == 0 else None}
        rows.append(row)
        print(f"T={temp} batch={batch} gamma={g}: alpha {alpha:.3f} tok/it {row['tokens_per_iteration']:.2f} "
              f"plain {plain_ms:.2f} spec {spec_ms:.2f} ms/token speedup {speedup:.2f}x "
              f"(expected {exp_r:.2f}x with r={r:.2f}, c={c:.3f}; {exp_alt:.2f}x with c alternating={c_alt:.3f}; "
              f"{exp_work:.2f}x for this workload)",
              flush=True)
      # Every (gamma, bucket) is its own executable; a full sweep compiles hundreds. Dropping them per group keeps
      # the process under the kernel's memory-map limit (the full default sweep died in LLVM with ENOMEM).
      jax.clear_caches()
  return rows


def run_peer(target, draft, ids, gammas, repeats, max_new):
  """transformers on the same weights (float32, CPU): plain greedy and assisted generation, batch 1."""
  import torch
  from transformers import T5ForConditionalGeneration
  with tempfile.TemporaryDirectory() as tmp:
    jaxspec.save(target, os.path.join(tmp, "t"), format="hf")
    jaxspec.save(draft, os.path.join(tmp, "d"), format="hf")
    t_hf = T5ForConditionalGeneration.from_pretrained(os.path.join(tmp, "t")).eval()
    d_hf = T5ForConditionalGeneration.from_pretrained(os.path.join(tmp, "d")).eval()
  for m in (t_hf, d_hf):
    # transformers' generate sizes its KV cache by config.num_layers (the ENCODER depth) and fails when the
    # decoder is deeper; the modules are built already, so raising the number only enlarges that cache.
    m.config.num_layers = max(m.config.num_layers, m.config.num_decoder_layers)
  common = dict(do_sample=False, num_beams=1, max_new_tokens=max_new, eos_token_id=target.config.eos_token_id,
                pad_token_id=target.config.pad_token_id, decoder_start_token_id=target.config.decoder_start_token_id)
  batches = [torch.tensor([i]) for i in ids]

  def plain(b):
    with torch.no_grad():
      return t_hf.generate(input_ids=b, **common)

  def assisted(g):
    def fn(b):
      d_hf.generation_config.num_assistant_tokens = g
      d_hf.generation_config.num_assistant_tokens_schedule = "constant"
      d_hf.generation_config.assistant_confidence_threshold = 0.0
      with torch.no_grad():
        return t_hf.generate(input_ids=b, assistant_model=d_hf, **common)
    return fn

  rows = []
  timed, _ = _interleaved_passes({"plain": plain, **{g: assisted(g) for g in gammas}}, batches, repeats)
  _, plain_s, plain_lat, plain_out = timed["plain"]
  plain_tokens = sum(int(o.shape[1] - 1) for o in plain_out)
  for g in gammas:
    _, spec_s, spec_lat, spec_out = timed[g]
    tokens = sum(int(o.shape[1] - 1) for o in spec_out)
    rows.append({"gamma": g, "plain_ms_per_token": 1e3 * plain_s / plain_tokens,
                 "assisted_ms_per_token": 1e3 * spec_s / tokens,
                 "speedup": (plain_s / plain_tokens) / (spec_s / tokens),
                 "plain_latency_s": _pct(plain_lat), "assisted_latency_s": _pct(spec_lat),
                 "torch_threads": torch.get_num_threads()})
    print(f"transformers gamma={g}: plain {rows[-1]['plain_ms_per_token']:.2f} assisted "
          f"{rows[-1]['assisted_ms_per_token']:.2f} ms/token", flush=True)
  return rows


def write_markdown(path, rows, peer, meta):
  lines = [f"Machine: {meta['machine']}; JAX {meta['jax']} on {meta['backend']}; target {meta['target']}; "
           f"draft {meta['draft']}; {meta['sentences']} inputs; medians of {meta['repeats']} passes.", "",
           "| Temp | Batch | gamma | alpha | tok/iter | c | c alt | r | plain ms/tok | spec ms/tok | Speedup | Exp "
           "| Exp (r) | meas/exp | Exp (workload) | meas/exp workload | meas/cost model | p50 / p90 / p99 s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lat = r["spec_latency_s"]
    lines.append(f"| {r['temperature']:g} | {r['batch']} | {r['gamma']} | {r['alpha']:.2f} | "
                 f"{r['tokens_per_iteration']:.2f} | {r['c']:.3f} | {r['c_alternating']:.3f} | {r['r']:.2f} | "
                 f"{r['plain_ms_per_token']:.2f} | {r['spec_ms_per_token']:.2f} | {r['speedup']:.2f}x | "
                 f"{r['expected_speedup']:.2f} | {r['expected_speedup_with_r']:.2f} | "
                 f"{r['measured_over_expected']:.2f} | {r['expected_speedup_workload']:.2f} | "
                 f"{r['measured_over_expected_workload']:.2f} | {r['measured_over_cost_model']:.2f} | "
                 f"{lat['p50']:.3f} / {lat['p90']:.3f} / {lat['p99']:.3f} |")
  if peer:
    jax_b1 = {r["gamma"]: r for r in rows if r["batch"] == 1 and r["temperature"] == 0}
    lines += ["", "Side by side with transformers (batch 1, temperature 0, same weights, same inputs):", "",
              "| gamma | transformers plain ms/tok | transformers assisted ms/tok | jaxspec plain ms/tok | "
              "jaxspec speculative ms/tok | jaxspec spec / transformers assisted |", "|---|---|---|---|---|---|"]
    for p in peer:
      if "error" in p:
        lines.append(f"| transformers failed: {p['error']} |")
        continue
      j = jax_b1.get(p["gamma"])
      if j:
        lines.append(f"| {p['gamma']} | {p['plain_ms_per_token']:.2f} | {p['assisted_ms_per_token']:.2f} | "
                     f"{j['plain_ms_per_token']:.2f} | {j['spec_ms_per_token']:.2f} | "
                     f"{j['spec_ms_per_token'] / p['assisted_ms_per_token']:.2f} |")
  best = recommend(rows)
  lines += [""] + [f"Recommended gamma at temperature {t:g}, batch {b}: {g} (measured {s:.2f}x)"
                   for (t, b), (g, s) in sorted(best.items())]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def recommend(rows):
  best = {}
  for r in rows:
    key = (r["temperature"], r["batch"])
    if key not in best or r["speedup"] > best[key][1]:
      best[key] = (r["gamma"], r["speedup"])
  return best


def plot(path, rows):
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


def main(argv):
  del argv
  if _PAPER.value is not None:
    p = _PAPER.value
    flags.FLAGS.target = os.path.join(p.checkpoint_dir, p.target)
    flags.FLAGS.draft = os.path.join(p.checkpoint_dir, p.draft)
    flags.FLAGS.input, flags.FLAGS.prefix = p.input, p.prefix
    flags.FLAGS.gammas, flags.FLAGS.temperatures = [str(p.gamma)], [str(p.temperature)]
    flags.FLAGS.batch_sizes, flags.FLAGS.max_new_tokens = [str(p.batch_size)], p.max_new_tokens
  target, draft = jaxspec.load(_TARGET.value), jaxspec.load(_DRAFT.value)
  ids = _inputs(target)
  gammas = [int(g) for g in _GAMMAS.value]
  rows = run_jaxspec(target, draft, ids, gammas, [float(t) for t in _TEMPERATURES.value],
                     [int(b) for b in _BATCH_SIZES.value], _REPEATS.value, _MAX_NEW.value)
  peer = []
  if _PEER.value:
    try:
      peer = run_peer(target, draft, ids, gammas, _REPEATS.value, _MAX_NEW.value)
    except Exception as e:  # pylint: disable=broad-except
      # The peer is a comparison, not the product: report its failure and keep jaxspec's results.
      print(f"transformers peer failed: {type(e).__name__}: {e}", flush=True)
      peer = [{"error": f"{type(e).__name__}: {e}"}]
  meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "jax": jax.__version__,
          "backend": jax.default_backend(), "target": repr(target), "draft": repr(draft), "sentences": len(ids),
          "repeats": _REPEATS.value, "date": time.strftime("%Y-%m-%d")}
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "results.json"), "w") as f:
    json.dump({"meta": meta, "jaxspec": rows, "transformers": peer,
               "recommended_gamma": {f"T={t:g},batch={b}": g for (t, b), (g, _) in recommend(rows).items()}},
              f, indent=2)
  write_markdown(os.path.join(_OUT.value, "results.md"), rows, peer, meta)
  plot(os.path.join(_OUT.value, "speedup.png"), rows)
  print(open(os.path.join(_OUT.value, "results.md")).read())


if __name__ == "__main__":
  app.run(main)
