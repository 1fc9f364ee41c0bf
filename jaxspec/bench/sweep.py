"""The benchmark sweep: plain decoding and speculative variants over (batch size, temperature), timed side by side.

A `Variant` is one speculative decoder: a named draft (a model, a `jaxspec.FeatureHead` or a `jaxspec.NGramDraft`),
gamma and schedule, whose `jaxspec.Speculation` may take values from the costs measured in the same run
(`speculation`). For every (batch size, temperature, variant): alpha, tau, tokens per iteration, acceptance per
draft position, draft lengths, wall time per generated token of plain and speculative decoding (medians over
interleaved passes after a warm-up pass that includes compilation, timed apart), tokens/s, latency percentiles per
sequence (every row of a batch waits for the batch), the speedup, and what Theorem 3.8 predicts from the measured
alpha with and without the measured verify-cost ratio r, and applied to the workload actually run
(`jaxspec.expected_speedup_for_workload`). c, r and the encoders' times are timed in isolation once per round (an
n-gram drafter's c is 0; a feature head's c is its own step's and its prefill counts as an encoder:
`jaxspec.bench.costs`). With `itl`, one more pass per decoder over the inputs of the most common prompt bucket
streams tokens (`on_tokens`) for inter-token latencies: its host round trip per iteration would distort tokens/s, so
that pass is never the timed one.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np

import jaxspec
from jaxspec.bench import costs, timing
from jaxspec.decoding.arguments import bucket_length
from jaxspec.decoding.generation import MAX_INPUT_LENGTH
from jaxspec.tools.outputs import progress


@dataclasses.dataclass(frozen=True)
class Variant:
  """One speculative decoder of the sweep."""

  draft: str  # a key of the sweep's drafts
  gamma: int
  schedule: str = "constant"  # Speculation.schedule
  tree: jaxspec.Tree | None = None  # Speculation.tree (schedule "constant")

  @property
  def label(self) -> str:
    """The schedule, or "tree K,N" for a token tree (the rows' "schedule" column)."""
    return self.schedule if self.tree is None else f"tree {self.tree.top_k},{self.tree.nodes}"

  def speculation(self, drafts: dict, **fields) -> jaxspec.Speculation:
    """This variant's Speculation with drafts[self.draft]; fields: its other values (draft_cost, ...)."""
    return jaxspec.Speculation(drafts[self.draft], gamma=self.gamma, schedule=self.schedule, tree=self.tree,
                               **fields)

  @classmethod
  def of_row(cls, row: dict) -> "Variant":
    """The variant that measured a row."""
    tree = row.get("tree")
    return cls(row["draft"], row["gamma"], "constant" if tree else row["schedule"],
               jaxspec.Tree(*tree) if tree else None)


def speculation_fields(speculation: jaxspec.Speculation) -> dict:
  """A Speculation's values but the draft, for a JSON row (rebuilt with `Variant.speculation(drafts, **fields)`
  minus gamma, schedule and tree)."""
  return {f.name: getattr(speculation, f.name) for f in dataclasses.fields(speculation)
          if f.name not in ("draft", "gamma", "schedule", "tree")}


def fixed_batches(ids: Sequence[list[int]], batch: int) -> list[list[list[int]]]:
  """ids in batches of exactly `batch` rows (the last one filled with copies of its last row)."""
  out = []
  for k in range(0, len(ids), batch):
    chunk = list(ids[k:k + batch])
    out.append(chunk + [chunk[-1]] * (batch - len(chunk)))
  return out


def _lookup_costs(target, gammas: Sequence[int], batch: int, repeats: int) -> dict:
  """cost_table's entries for a drafter without a model (c = 0): only the target's steps are timed."""
  t1 = costs.decoder_step_time(target, batch, 1, repeats=repeats)
  out = {}
  for g in gammas:
    tg = costs.decoder_step_time(target, batch, g + 1, repeats=repeats)
    out[g] = {"target_step_s": t1, "target_verify_s": tg, "draft_step_s": 0.0, "c": 0.0, "r": tg / t1,
              "draft_step_alternating_s": 0.0, "c_alternating": 0.0}
  return out


def _probe(target, drafts: dict, gammas: dict[str, list[int]], batch: int, buckets, repeats: int
           ) -> Callable[[], dict]:
  learned = {n: d for n, d in drafts.items() if isinstance(d, (jaxspec.Model, jaxspec.FeatureHead)) and n in gammas}

  def probe():
    """c and r per draft and gamma (one interleaved round of `cost_table`) and the encoders' times (a head's:
    its prefill), in isolation."""
    table = {n: costs.cost_table(target, d, gammas[n], batch=batch, repeats=repeats, rounds=1)
             for n, d in learned.items()}
    table.update({n: _lookup_costs(target, g, batch, repeats) for n, g in gammas.items() if n not in learned})
    encoder_s = {n: {"target": costs.encoder_time(target, batch, n, repeats=repeats),
                     **{m: costs.draft_prefill_time(target, d, batch, n, repeats=repeats) for m, d in learned.items()}}
                 for n in sorted(set(buckets))}
    return {"costs": table, "encoder_s": encoder_s}
  return probe


def _acceptance(target, drafts: dict, variants: Sequence[Variant], batches: list, sampling: jaxspec.Sampling,
                kw: dict) -> dict:
  """{(draft name, gamma): alpha} for each adaptive variant: the draft's acceptance with constant gamma over
  every batch (None when nothing was drafted), the calibration its Speculation starts from (prior_alpha). The same
  inputs are then timed: in a tune table adaptive starts from the inputs' own rate (translate.py's pool
  calibrates on its first inputs and decodes the rest)."""
  out = {}
  for key in sorted({(v.draft, v.gamma) for v in variants if v.schedule == "adaptive"}):
    spec = jaxspec.Speculation(drafts[key[0]], gamma=key[1])
    stats = [jaxspec.generate(target, b, spec, sampling, **kw).stats for b in batches]
    alpha = jaxspec.DecodeStats.concatenate(stats).alpha
    out[key] = None if np.isnan(alpha) else alpha
  return out


def _per_sequence(passes: timing.Passes, real: list[int]) -> dict:
  """Latency percentiles per sequence: every real row of a batch takes that batch's time."""
  return timing.percentiles([s for s, n in zip(passes.latencies_s, real) for _ in range(n)])


def _itl(fn, batches, real: list[int]) -> dict:
  """Inter-token latency percentiles in ms: for every row, the time between consecutive deliveries of new tokens
  (one delivery per loop iteration: a speculative one brings up to gamma + 1 tokens at once)."""
  gaps = []
  for rows, b in zip(real, batches):
    chunks = []
    fn(b, on_tokens=chunks.append)
    last = {}
    for chunk in chunks:
      for row in np.flatnonzero(chunk.counts[:rows]):
        if row in last:
          gaps.append(1e3 * (chunk.time - last[row]))
        last[row] = chunk.time
  return timing.percentiles(gaps) if gaps else {}


def _texts(passes: timing.Passes, n: int) -> list[str] | None:
  outs = passes.outputs
  if outs[0].texts is None:
    return None
  return [t for o in outs for t in o.texts][:n]


def _row(temp, batch, v: Variant, fields: dict, plain: timing.Passes, spec: timing.Passes, cg: dict, encoder_s,
         buckets, real: list[int], keep_tokens: bool = False) -> dict:
  tokens = sum(int(o.lengths.sum()) for o in spec.outputs)  # padding rows included: they were decoded too
  plain_tokens = sum(int(o.lengths.sum()) for o in plain.outputs)
  mask = np.concatenate([np.arange(batch) < n for n in real])  # the statistics of the real rows only
  stats = jaxspec.DecodeStats.concatenate([o.stats for o in spec.outputs]).select(mask)
  alpha = stats.alpha
  a = min(alpha, 1.0) if alpha == alpha else 0.0  # NaN when nothing was verified (a drafter that never proposed)
  g = v.gamma
  c, r = cg["c"], cg["r"]
  c_alt = cg["c_alternating"]  # Ratios of the medians, not medians of ratios.
  t1 = cg["target_step_s"]
  fixed_plain = [encoder_s[n]["target"] / t1 for n in buckets]
  fixed_spec = [(encoder_s[n]["target"] + encoder_s[n].get(v.draft, 0.0)) / t1 for n in buckets]
  plain_ms, spec_ms = 1e3 * plain.median_s / plain_tokens, 1e3 * spec.median_s / tokens
  speedup = plain_ms / spec_ms
  # Each round times plain and this variant in the same minutes: the spread of the per-round speedups around the
  # median's (0 with one round: nothing measured it) says how far the machine's noise moves the number.
  per_round = [(p / plain_tokens) / (q / tokens) for p, q in zip(plain.totals_s, spec.totals_s) if q > 0]
  spread = max((abs(x - speedup) for x in per_round), default=0.0)
  exp_r = jaxspec.expected_speedup(a, g, c, r)
  exp_alt = jaxspec.expected_speedup(a, g, c_alt, r)
  exp_work = jaxspec.expected_speedup_for_workload([o.lengths.tolist() for o in spec.outputs], a, g, c_alt, r,
                                                   fixed_plain, fixed_spec)
  k = stats.mean_draft_length
  extra = {}
  if keep_tokens and temp == 0:  # plain decoding's new tokens per real input, in input order (EOS included)
    extra["plain_token_ids"] = [o.tokens[i, :o.lengths[i]].tolist() for o, n in zip(plain.outputs, real)
                                for i in range(n)]
  return {"draft": v.draft, "schedule": v.label, "tree": None if v.tree is None else [v.tree.top_k, v.tree.nodes],
          "speculation": fields, "temperature": temp, "batch": batch, "gamma": g,
          "alpha": alpha, "alpha_per_row": np.round(stats.alpha_per_row, 4).tolist(),
          "tokens_per_iteration": stats.tokens_per_iteration,
          "tau": float(stats.accepted.sum() / max(stats.iterations.sum(), 1)),  # accepted drafts per iteration
          "acceptance_per_position": stats.acceptance_per_position.tolist(),
          "mean_draft_length": k, "draft_lengths": stats.draft_lengths.sum(0).tolist(),
          "fallback_share": float(stats.fallback_iterations.sum() / max(stats.iterations.sum(), 1)),
          "c": c, "r": r, "target_step_ms": 1e3 * t1, "draft_step_ms": 1e3 * cg["draft_step_s"],
          "plain_ms_per_token": plain_ms, "spec_ms_per_token": spec_ms, "speedup": speedup,
          "speedup_spread": spread, "rounds": len(per_round),
          "plain_tokens_per_s": 1e3 / plain_ms, "spec_tokens_per_s": 1e3 / spec_ms,
          "expected_speedup": jaxspec.expected_speedup(a, g, c),
          "expected_speedup_with_r": exp_r, "measured_over_expected": speedup / exp_r,
          # The draft's cost when it runs between target calls (what the loop does; on a CPU the target's pass
          # evicts the draft's weights from the caches):
          "c_alternating": c_alt,
          "expected_speedup_with_r_alternating": exp_alt, "measured_over_expected_alternating": speedup / exp_alt,
          # That cost model fed the MEASURED tokens per iteration and draft length instead of alpha's i.i.d.
          # prediction at gamma: what is left between this and the measurement is the loop's own overhead.
          "cost_model_speedup": stats.tokens_per_iteration / (k * c_alt + r),
          # Theorem 3.8's model on the workload actually run (still from alpha, c alt and r alone): each sequence's
          # last iteration cut at EOS, a batch waiting for its slowest row, and the encoders (timed in isolation
          # per prompt bucket) paid once per call by both decoders.
          "encoder_ms_per_call": {str(n): {m: 1e3 * s for m, s in e.items()} for n, e in encoder_s.items()},
          "expected_speedup_workload": exp_work, "measured_over_expected_workload": speedup / exp_work,
          "measured_over_cost_model": speedup * (k * c_alt + r) / stats.tokens_per_iteration,
          "plain_compile_and_first_pass_s": plain.warmup_s, "spec_compile_and_first_pass_s": spec.warmup_s,
          "plain_latency_s": _per_sequence(plain, real), "spec_latency_s": _per_sequence(spec, real),
          "identical_to_plain": bool(all(np.array_equal(x.tokens, y.tokens) for x, y in
                                         zip(plain.outputs, spec.outputs))) if temp == 0 else None, **extra}


def measure(target, drafts: dict, variants: Sequence[Variant], ids: Sequence[list[int]],
            temperatures: Sequence[float], batch_sizes: Sequence[int], repeats: int, max_new: int,
            speculation: Callable[[Variant, dict], jaxspec.Speculation] | None = None, top_k: int = 0,
            top_p: float = 1.0, itl: bool = False,
            score: Callable[[list[str]], dict] | None = None, verbose: bool = True, probe_repeats: int = 5,
            keep_tokens: bool = False) -> list[dict]:
  """One row per (batch size, temperature, variant); see the module docstring.

  Args:
    drafts: {name: jaxspec.Model, jaxspec.FeatureHead or jaxspec.NGramDraft}; each variant names one.
    speculation: (variant, its cost entry {c, r, c_alternating, ...} from a probe before the passes, with
      "alpha": the draft's acceptance at the variant's gamma, constant schedule, over the inputs; None when
      nothing was drafted) -> the variant's Speculation (e.g. schedule="adaptive" with draft_cost,
      fallback_alpha and prior_alpha from the costs); None: `Variant.speculation(drafts)`.
    top_k, top_p: every pass's sampling filters (with each temperature).
    score: texts of the real inputs, in order -> quality scores (rows get "quality" and "plain_quality").
    verbose: print one line per row.
    probe_repeats: timed calls (of n calls each) per cost measurement in a probe; 1 for models whose step takes
      hundreds of ms (a probe runs before the passes and in every round).
    keep_tokens: temperature-0 rows get "plain_token_ids" (plain decoding's new tokens per input), to compare
      with another implementation's greedy output.
  """
  rows = []
  gammas = {}
  for v in variants:
    gammas.setdefault(v.draft, set()).add(v.gamma)
  gammas = {n: sorted(g) for n, g in gammas.items()}
  bar = progress(len(batch_sizes) * len(temperatures) * (repeats + 1 + itl), "sweep", unit="round")
  for batch in batch_sizes:
    batches = fixed_batches(ids, batch)
    real = [min(batch, len(ids) - k) for k in range(0, len(ids), batch)]
    buckets = [bucket_length(max(len(r) for r in b), MAX_INPUT_LENGTH) for b in batches]
    common = max(set(buckets), key=buckets.count)
    probe = _probe(target, drafts, gammas, batch, buckets, probe_repeats)
    cached = [probe()]  # compiles the probe; adaptive variants take values from it
    first = cached[0]["costs"]
    # interleaved_passes calls the probe once more before its warm-ups only to compile it: the first time, the
    # probe above has done that (later temperatures recompile: the caches are cleared after each group).
    def compiled_probe():
      return cached.pop() if cached else probe()
    for temp in temperatures:
      sampling = jaxspec.Sampling(temperature=temp, top_k=top_k, top_p=top_p)
      kw = dict(max_new_tokens=max_new, seed=0)
      seen = _acceptance(target, drafts, variants, batches, sampling, kw) if speculation else {}
      specs = {v: speculation(v, dict(first[v.draft][v.gamma], alpha=seen.get((v.draft, v.gamma))))
               if speculation else v.speculation(drafts) for v in variants}
      fns = {"plain": lambda b, **o: jaxspec.generate(target, b, None, sampling, **kw, **o)}
      fns.update({v: (lambda b, v=v, **o: jaxspec.generate(target, b, specs[v], sampling, **kw, **o))
                  for v in variants})
      timed, probes = timing.interleaved_passes(fns, batches, repeats, compiled_probe,
                                                on_round=lambda: bar.update(1))
      measured = timing.median_tree(probes)
      latency = {}
      if itl:
        pick = [k for k, n in enumerate(buckets) if n == common]
        latency = {name: _itl(fn, [batches[k] for k in pick], [real[k] for k in pick]) for name, fn in fns.items()}
        bar.update(1)
      plain_quality = None
      if score is not None and (texts := _texts(timed["plain"], len(ids))) is not None:
        plain_quality = score(texts)
      for v in variants:
        row = _row(temp, batch, v, speculation_fields(specs[v]), timed["plain"],
                   timed[v], measured["costs"][v.draft][v.gamma], measured["encoder_s"], buckets, real,
                   keep_tokens)
        if itl:
          row.update(plain_itl_ms=latency["plain"], spec_itl_ms=latency[v])
        if plain_quality is not None:
          row.update(plain_quality=plain_quality, quality=score(_texts(timed[v], len(ids))))
        rows.append(row)
        if verbose:
          bar.write(f"T={temp:g} batch={batch} {v.draft} {v.label} gamma={v.gamma}: alpha {row['alpha']:.3f} "
                    f"tok/it {row['tokens_per_iteration']:.2f} plain {row['plain_ms_per_token']:.2f} spec "
                    f"{row['spec_ms_per_token']:.2f} ms/token speedup {row['speedup']:.2f}x (Theorem 3.8 with r: "
                    f"{row['expected_speedup_with_r']:.2f}x, c={row['c']:.3f}, r={row['r']:.2f})")
      # Every (variant, bucket) is its own executable; a full sweep compiles hundreds. Dropping them per group
      # keeps the process under the kernel's memory-map limit (the full default sweep died in LLVM with ENOMEM).
      jax.clear_caches()
  bar.close()
  return rows
