"""`jaxspec.tune`: which draft, gamma and schedule decode these inputs fastest, measured, and why.

    result = jaxspec.tune(target, {"ende-draft": draft, "ngram": jaxspec.NGramDraft()}, texts,
                          gammas=(1, 2, 3, 4), batch_sizes=(1, 4), temperatures=(0.0, 1.0), references=refs)
    result.rows                  # one dict per draft x gamma x schedule x batch size x temperature
    result.best[(0.0, 1)]        # a Choice: .speculation, the fastest variant's (None: plain decoding wins)
    print("\\n".join(result.table()))
    jaxspec.tune(target, {"head": jaxspec.load(eagle3_head_dir), "ngram": jaxspec.NGramDraft()}, prompts)

Every variant is timed against plain decoding side by side on the same inputs (`jaxspec.bench.sweep`:
interleaved passes after a warm-up pass, medians; c and r timed in isolation in the same minutes). The
"adaptive" rows run with a Speculation whose values come from the costs measured in the same run
(`adaptive_fields`): draft_cost = c / r
(a draft step per verify call of width gamma + 1), fallback_alpha = the acceptance rate below which every
draft length is expected to be FALLBACK_VALUE times plain decoding's speed or slower at those costs (Theorem 3.8
with r; for a draft that pays on average, at most its measured alpha - NOISE_MARGIN), so a batch whose draft
stops helping decodes plainly, and prior_alpha = the draft's acceptance at that
gamma, constant schedule, over the inputs (a useless draft then rests from its first iteration; a one-pass
calibration, untimed). A row's quality
columns are sacrebleu's BLEU and chrF against `references` when given.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from typing import Sequence

import jax
import numpy as np

import jaxspec
from jaxspec.decoding.generation import MAX_INPUT_LENGTH
from jaxspec.bench import sweep
from jaxspec.tools.inputs import encode_texts
from jaxspec.errors import CheckpointError, SettingsError
from jaxspec.models import eagle3

SCHEDULES = ("constant", "adaptive", "heuristic")
MIN_SPEEDUP = 1.02  # a variant is chosen over plain decoding only when measured this much faster beyond its spread
# A row rests (fallback) when drafting is expected to be this much slower than plain decoding or worse: not at
# the break-even point (1.0), because the running estimate is noisy (~10 positions) and resting on a dip of a
# good draft costs its speedup, while a useless draft's estimate falls far below any threshold.
FALLBACK_VALUE = 0.9
NOISE_MARGIN = 0.25  # how far below a paying draft's measured alpha the running estimate must fall to rest


@dataclasses.dataclass(frozen=True)
class Choice:
  """The decoder to use at one (temperature, batch size): a variant's `jaxspec.Speculation`, or None for plain
  decoding; pass `choice.speculation` to jaxspec.generate (or batching.generate_all) as it is."""

  temperature: float
  batch: int
  speculation: jaxspec.Speculation | None  # None: plain decoding
  draft_name: str | None = None  # the tuner's key of its draft
  speedup: float = 1.0  # measured over plain decoding (1.0 for plain)
  why: str = ""

  def describe(self) -> str:
    if self.speculation is None:
      return "plain decoding"
    s = self.speculation
    fields = sweep.speculation_fields(s)
    shape = s.schedule if s.tree is None else f"tree top_k {s.tree.top_k} nodes {s.tree.nodes}"
    return f"{self.draft_name}, gamma {s.gamma}, {shape}" + "".join(
        f", {k} {v:.3g}" for k, v in fields.items() if v is not None and v != _DEFAULTS[k])

  def to_json(self) -> dict:
    s = self.speculation
    return {"temperature": self.temperature, "batch": self.batch, "draft": self.draft_name, "speedup": self.speedup,
            "why": self.why, **({} if s is None else {"gamma": s.gamma, "schedule": s.schedule,
                                                       "tree": None if s.tree is None else [s.tree.top_k, s.tree.nodes],
                                                       **sweep.speculation_fields(s)})}


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(jaxspec.Speculation)}


@dataclasses.dataclass
class TuneResult:
  rows: list[dict]  # sweep rows with quality (see jaxspec.bench.sweep and the README's table)
  best: dict  # {(temperature, batch): Choice}
  meta: dict

  def table(self) -> list[str]:
    """The rows as an aligned markdown table (the benchmark's columns, plus draft, schedule, latency, quality)."""
    from jaxspec.bench import report  # pylint: disable=import-outside-toplevel
    return report.tune_table(self.rows)

  def to_json(self) -> dict:
    return {"meta": self.meta, "rows": self.rows,
            "best": {f"T={t:g},batch={b}": c.to_json() for (t, b), c in sorted(self.best.items())}}


def break_even_alpha(c: float, r: float, gamma: int, value: float = 1.0) -> float:
  """The smallest alpha at which some draft length k <= gamma reaches `value` times plain decoding's speed at these
  costs: max_k E[tokens](alpha, k) / (k c + r) >= value (Theorem 3.8 with r). 0 when it does at any alpha, 1 when
  at none."""
  def best(a: float) -> float:
    return max(jaxspec.expected_speedup(a, k, c, r) for k in range(1, gamma + 1))
  if best(0.0) >= value:
    return 0.0
  if best(1.0) < value:
    return 1.0
  lo, hi = 0.0, 1.0
  for _ in range(30):
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if best(mid) >= value else (mid, hi)
  return hi


def adaptive_fields(c: float, r: float, gamma: int, alpha: float | None = None) -> dict:
  """schedule="adaptive"'s Speculation values for measured costs: c (a draft step per target step, as the loop runs it) and
  r (a verify call of gamma + 1 tokens per target step), and the draft's measured acceptance alpha (None: not
  measured) as the rows' starting estimate.

  fallback_alpha is the acceptance below which drafting is expected at FALLBACK_VALUE times plain decoding's speed
  or slower; but when the measured alpha says that drafting pays on average (above the break-even point), the
  batch rests only when its running estimate falls NOISE_MARGIN below that alpha (a threshold close below a good
  draft's rate rests it on the estimate's dips: docs/adaptive.md)."""
  fallback = break_even_alpha(c, r, gamma, FALLBACK_VALUE)
  fields = {"draft_cost": c / r}
  if alpha is not None:
    alpha = float(min(max(alpha, 0.0), 1.0))
    if alpha > break_even_alpha(c, r, gamma, 1.0):
      fallback = min(fallback, max(alpha - NOISE_MARGIN, 0.0))
    fields["prior_alpha"] = alpha
  return {**fields, "fallback_alpha": fallback}


# The tree shapes `--tree=auto` tries (translate.py): a narrow and a wide tree (EAGLE-2 uses top_k 8-10 and 60
# nodes on GPUs; on a CPU, where a verify of N tokens costs about N times one, small trees are the candidates).
TREE_SHAPES = (jaxspec.Tree(top_k=2, nodes=6), jaxspec.Tree(top_k=4, nodes=12))


def calibrated(drafts: dict):
  """The sweep's `speculation` callback: each variant's Speculation, adaptive ones with `adaptive_fields` from
  the costs and acceptance measured in the same run."""
  def speculation(variant: sweep.Variant, cost: dict) -> jaxspec.Speculation:
    if variant.schedule != "adaptive":
      return variant.speculation(drafts)
    c = max(cost["c"], cost["c_alternating"])  # the alternating cost is what the loop pays; never below isolation
    return variant.speculation(drafts, **adaptive_fields(c, cost["r"], variant.gamma, cost.get("alpha")))
  return speculation


def _scorer(references: Sequence[str]):
  import sacrebleu  # pylint: disable=import-outside-toplevel

  def score(hyps: list[str]) -> dict:
    return {"bleu": sacrebleu.corpus_bleu(hyps, [list(references)]).score,
            "chrf": sacrebleu.corpus_chrf(hyps, [list(references)]).score}
  return score


def _label(row: dict) -> str:
  return f"{row['draft']} {row['schedule']} gamma {row['gamma']}"


def _drafted_nothing(row: dict) -> bool:
  """A row that drafted no token (a drafter that never proposed, or a batch resting throughout): it decoded
  plainly, whatever its timing says."""
  return not row.get("mean_draft_length", 1.0) > 0


def choose(rows: list[dict], drafts: dict, min_speedup: float = MIN_SPEEDUP) -> dict:
  """{(temperature, batch): Choice}: the measured fastest row of each, or plain decoding when none is faster than
  plain by at least min_speedup plus its measured spread (`speedup_spread`: how far its per-round speedups lie
  from the median; 0 with one round). A row that drafted nothing (rested throughout) decoded plainly: it is never
  chosen, and the reason names it as plain decoding. drafts: the rows' drafts by name."""
  best = {}
  for key in sorted({(r["temperature"], r["batch"]) for r in rows}):
    group = sorted((r for r in rows if (r["temperature"], r["batch"]) == key), key=lambda r: -r["speedup"])
    rested = [r for r in group if _drafted_nothing(r)]
    live = [r for r in group if not _drafted_nothing(r)]
    notes = "".join(f"; {_label(r)} drafted nothing (rested throughout): it is plain decoding" for r in rested[:3])
    if len(rested) > 3:
      notes += f" (and {len(rested) - 3} more)"
    if not live:
      best[key] = Choice(key[0], key[1], None, why=f"no variant drafted anything{notes}")
      continue
    top = live[0]
    runner = (f"; next: {_label(live[1])} {live[1]['speedup']:.2f}x" if len(live) > 1 else "")
    spread, rounds = float(top.get("speedup_spread", 0.0)), top.get("rounds")
    noise = (f" +- {spread:.2f} over {rounds} rounds" if rounds is not None and rounds > 1 else
             " (1 round: no spread measured)" if rounds == 1 else "")
    facts = (f"{top['speedup']:.2f}x{noise} over plain decoding ({top['plain_ms_per_token']:.2f} -> "
             f"{top['spec_ms_per_token']:.2f} ms/token; alpha {top['alpha']:.2f}, {top['tokens_per_iteration']:.2f} "
             f"tokens/iteration, {top['mean_draft_length']:.2f} drafted, c {top['c']:.3f}, r {top['r']:.2f}; "
             f"Theorem 3.8 with r predicts {top['expected_speedup_with_r']:.2f}x)")
    if top["speedup"] >= min_speedup + spread:
      variant = sweep.Variant.of_row(top)
      best[key] = Choice(key[0], key[1], variant.speculation(drafts, **top["speculation"]), top["draft"],
                         top["speedup"], f"fastest of {len(group)}: {facts}{runner}{notes}")
    elif top["speedup"] >= min_speedup:
      best[key] = Choice(key[0], key[1], None, why=f"no variant is faster than plain decoding by more than its "
                                                   f"spread: the best, {_label(top)}, measured {facts}, within its "
                                                   f"spread (it needs {min_speedup + spread:.2f}x){notes}")
    else:
      best[key] = Choice(key[0], key[1], None, why=f"no variant is {min_speedup:.2f}x faster than plain decoding; "
                                                   f"the best, {_label(top)}, measured {facts}{notes}")
  return best


def variants(drafts: dict, gammas: Sequence[int], schedules: Sequence[str],
             trees: Sequence[jaxspec.Tree] = ()) -> list[sweep.Variant]:
  """Every draft x gamma x schedule, then every draft x tree shape x gamma that suits the shape
  (`Tree.fits`), each once (repeated gammas or shapes are timed once). SettingsError for a tree that is not a
  `jaxspec.Tree`, or a shape that suits none of the gammas (never dropped silently)."""
  for t in trees:
    if not isinstance(t, jaxspec.Tree):
      raise SettingsError(f"trees must be jaxspec.Tree(top_k, nodes) shapes, got {t!r} ({type(t).__name__}).")
  gammas = list(dict.fromkeys(int(g) for g in gammas))
  trees = list(dict.fromkeys(trees))
  for t in trees:
    if not any(t.fits(g) for g in gammas):
      raise SettingsError(f"{t!r} suits none of gammas {gammas}: a tree's depth (gamma) must be at most its nodes "
                          f"and propose at least nodes candidates (top_k + (gamma - 1) * top_k**2 >= nodes).")
  out = [sweep.Variant(name, g, s) for name in drafts for s in dict.fromkeys(schedules) for g in gammas]
  out += [sweep.Variant(name, g, "constant", t) for name in drafts for t in trees for g in gammas if t.fits(g)]
  return out


def _check(target, drafts, ids, references, gammas, batch_sizes, temperatures, schedules) -> None:
  if not isinstance(drafts, dict) or not drafts:
    raise ValueError("drafts must be a non-empty dict {name: jaxspec.Model, jaxspec.FeatureHead or "
                     "jaxspec.NGramDraft}.")
  for name, d in drafts.items():
    if not isinstance(d, (jaxspec.Model, jaxspec.FeatureHead, jaxspec.NGramDraft)):
      raise ValueError(f"drafts[{name!r}] must be a jaxspec.Model, a jaxspec.FeatureHead or a jaxspec.NGramDraft, "
                       f"got {type(d).__name__}.")
    if isinstance(d, jaxspec.FeatureHead):  # before any timing: a head trained for another target is one error
      try:
        eagle3.check_fits(d.config, target.config, d.params)
      except CheckpointError as e:
        raise CheckpointError(f"drafts[{name!r}]: {e}") from None
  if not ids or any(not i for i in ids):
    raise ValueError("inputs must be a non-empty list of non-empty texts or token-id lists.")
  if references is not None and len(references) != len(ids):
    raise ValueError(f"references must hold one text per input: {len(references)} for {len(ids)} inputs.")
  if references is not None and target.tokenizer is None:
    raise ValueError("references need a target with a tokenizer (outputs are scored as text).")
  for name, values, ok in (("gammas", gammas, lambda g: isinstance(g, (int, np.integer)) and g >= 1),
                           ("batch_sizes", batch_sizes, lambda b: isinstance(b, (int, np.integer)) and b >= 1),
                           ("temperatures", temperatures, lambda t: np.isfinite(t) and t >= 0),
                           ("schedules", schedules, lambda s: s in SCHEDULES)):
    if not values or not all(ok(v) for v in values):
      raise ValueError(f"{name} must be a non-empty list of valid values, got {values!r}.")


def tune(target: jaxspec.Model, drafts: dict, inputs, *, gammas: Sequence[int] = (1, 2, 3, 4, 6),
         batch_sizes: Sequence[int] = (1,), temperatures: Sequence[float] = (0.0,),
         schedules: Sequence[str] = ("constant", "adaptive"), trees: Sequence[jaxspec.Tree] = (),
         references: Sequence[str] | None = None,
         top_k: int = 0, top_p: float = 1.0, repeats: int = 3, max_new_tokens: int = 64, itl: bool = True,
         min_speedup: float = MIN_SPEEDUP,
         max_input_length: int = MAX_INPUT_LENGTH, verbose: bool = True) -> TuneResult:
  """Times every draft x gamma x schedule x batch size x temperature against plain decoding on `inputs`.

  Args:
    target: the model whose output is produced (every variant's output is the target's, exactly).
    drafts: {name: jaxspec.Model (same tokenizer), jaxspec.FeatureHead (an EAGLE-3 head trained on this target:
      CheckpointError when it does not fit) or jaxspec.NGramDraft}. Each gets its own gamma x schedule sweep and
      its own measured c and r (a head's c: its step against the target's step); "adaptive" rows take their
      values from them, the others keep the Speculation's defaults (draft_cost None: the drafter's default,
      head_drafter.HEAD_DRAFT_COST for a head).
    inputs: texts (the target needs a tokenizer) or token-id lists; all of them are decoded in every pass.
    schedules: among "constant", "adaptive" (values from the measured costs, see the module docstring) and
      "heuristic".
    trees: token-tree shapes (`jaxspec.Tree`) tried with every draft (model, head, prompt lookup) at every gamma
      that suits the shape (`Tree.fits`: deep enough, and no deeper than its nodes), schedule "constant"; () tries
      chains only. A shape that suits none of the gammas is a SettingsError; repeated shapes are timed once.
    references: one reference text per input: rows get BLEU and chrF (sacrebleu) of their outputs and of plain
      decoding's.
    top_k, top_p: sampling filters of every pass (as jaxspec.generate's).
    repeats: timed rounds (every variant and plain decoding once each, in a rotating order), after one warm-up
      pass; the median is reported, and the spread of the per-round speedups (`speedup_spread`) decides with
      min_speedup whether a variant beats plain decoding.
    itl: one more streaming pass per variant for inter-token latencies (inputs of the most common prompt bucket).
    min_speedup: the measured speedup a variant needs, beyond its spread, to be chosen over plain decoding; a
      variant that drafted nothing (rested throughout) is plain decoding and never chosen.
  Returns:
    TuneResult: rows (the table), best ({(temperature, batch): Choice}) and meta (machine, models, date).
  """
  ids = inputs
  if inputs and all(isinstance(t, str) for t in inputs):
    if target.tokenizer is None:
      raise ValueError("text inputs need a target with a tokenizer; pass token-id lists instead.")
    ids = encode_texts(target.tokenizer, list(inputs), max_input_length=max_input_length)
  ids = [list(map(int, i)) for i in ids]
  _check(target, drafts, ids, references, gammas, batch_sizes, temperatures, schedules)
  for name, value in (("repeats", repeats), ("max_new_tokens", max_new_tokens)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise SettingsError(f"{name} must be an integer >= 1, got {value!r}.")
  pool = variants(drafts, gammas, schedules, trees)
  start, load = time.time(), os.getloadavg()
  rows = sweep.measure(target, drafts, pool, ids, temperatures, batch_sizes, repeats, max_new_tokens,
                       speculation=calibrated(drafts), top_k=top_k, top_p=top_p, itl=itl,
                       score=None if references is None else _scorer(references), verbose=verbose)
  meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "jax": jax.__version__,
          "backend": jax.default_backend(), "target": repr(target),
          "drafts": {n: repr(d) for n, d in drafts.items()}, "inputs": len(ids), "repeats": repeats,
          "max_new_tokens": max_new_tokens, "min_speedup": min_speedup, "seconds": time.time() - start,
          "load_average_before_after": [load[0], os.getloadavg()[0]], "date": time.strftime("%Y-%m-%d %H:%M")}
  return TuneResult(rows=rows, best=choose(rows, drafts, min_speedup), meta=meta)


def speculation_table(rows: list[dict], draft: str | None = None, temperature: float = 0.0,
                      min_speedup: float = MIN_SPEEDUP):
  """The slot engine's load table (`jaxspec.serving.SpeculationTable`) from `tune`'s rows (`result.rows`
  of a tune over several batch sizes): for each measured batch size, in increasing order, the fastest chain or
  tree of `draft` (a name of tune's `drafts`; None: the only draft of the rows) with schedule "constant" (what the
  engine runs) at `temperature`, or plain decoding (gamma 0) when none is at least `min_speedup` times faster
  than plain. Entry i covers active slots up to its batch size (the last one every count above). Changes nothing
  in `tune`; `table.to_json()` stores it for `launch/serve.py`.

  Raises:
    SettingsError: no row of that draft and temperature, or several drafts and `draft` None.
  """
  from jaxspec.serving.table import SpeculationTable, TableEntry  # pylint: disable=import-outside-toplevel
  names = sorted({r["draft"] for r in rows})
  if draft is None:
    if len(names) != 1:
      raise SettingsError(f"the rows have drafts {names}: name the one the engine serves with (draft=...).")
    draft = names[0]
  mine = [r for r in rows if r["draft"] == draft and r["temperature"] == temperature
          and (r.get("tree") or r["schedule"] == "constant")]
  if not mine:
    raise SettingsError(f"no 'constant' or tree row of draft {draft!r} at temperature {temperature} in the rows "
                        f"(drafts: {names}).")
  entries = []
  for batch in sorted({r["batch"] for r in mine}):
    top = max((r for r in mine if r["batch"] == batch), key=lambda r: r["speedup"])
    if top["speedup"] < min_speedup:
      entries.append(TableEntry(max_active=batch, gamma=0))
    else:
      tree = top.get("tree")
      entries.append(TableEntry(max_active=batch, gamma=top["gamma"],
                                tree=None if not tree else jaxspec.Tree(top_k=tree[0], nodes=tree[1])))
  return SpeculationTable(tuple(entries))
