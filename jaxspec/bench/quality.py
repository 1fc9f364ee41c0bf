"""Translation quality of a target, its draft and speculative decoding on EN-DE pairs (launch/evaluate.py).

BLEU and chrF (sacrebleu) of each, overall and per domain (natural sentences, documentation, software strings:
`jaxspec.data.ende.Pair.domain`); for speculative decoding alpha, tokens per iteration and acceptance per
position, overall and per domain, also without the inputs on which the target falls into a repetition loop (a
draft predicts those easily); and how many speculative outputs equal the target's.
"""

from __future__ import annotations

import platform
import re
import time

import numpy as np

import jaxspec
from jaxspec.tools.batching import generate_all
from jaxspec.decoding.generation import MAX_INPUT_LENGTH
from jaxspec.data.ende import by_domain, evenly_spaced
from jaxspec.tools.inputs import encode_texts
from jaxspec.tools.outputs import markdown_table

DECODERS = ("target", "draft", "speculative")


def is_repetition_loop(text: str) -> bool:
  """A degenerate output: one character repeated 10+ times, or 8+ words of which at most a third are distinct.

  Weak models fall into such loops; a draft predicts them easily, so alpha is reported with and without them.
  """
  words = text.split()
  return bool(re.search(r"(.)\1{9,}", text)) or (len(words) >= 8 and len(set(words)) <= len(words) / 3)


def select_pairs(pairs: list, *, natural_only: bool = False, limit: int = 0, limit_per_domain: int = 0) -> list:
  """The pairs to evaluate: natural sentences only or all; `limit` evenly spaced pairs over the whole list, or
  `limit_per_domain` evenly spaced pairs of each domain (domains in DOMAINS order)."""
  if natural_only:
    pairs = [p for p in pairs if p.is_natural]
  if limit_per_domain:
    pairs = [p for ps in by_domain(pairs).values() for p in evenly_spaced(ps, limit_per_domain)]
  return evenly_spaced(pairs, limit)


def scores(hyps: list[str], refs: list[str], domains: np.ndarray) -> dict:
  """{"bleu", "chrf", "bleu_<domain>", "chrf_<domain>", ...} of hypotheses against one reference each."""
  import sacrebleu
  out = {}
  for name, keep in [("", np.ones(len(refs), bool))] + [("_" + d, domains == d) for d in dict.fromkeys(domains)]:
    h, r = [x for x, k in zip(hyps, keep) if k], [[x for x, k in zip(refs, keep) if k]]
    out["bleu" + name], out["chrf" + name] = sacrebleu.corpus_bleu(h, r).score, sacrebleu.corpus_chrf(h, r).score
  return out


def evaluate_pair(target, draft, pairs, *, natural_only: bool = False, limit: int = 0, limit_per_domain: int = 0,
                  gamma: int = 3, sampling: jaxspec.Sampling | None = None, decoders: tuple[str, ...] = DECODERS,
                  **kw) -> dict:
  """{"pairs", "pairs_per_domain", "machine", and per decoder: {bleu, chrf, per domain, seconds, ...},
  "speculative_identical_to_target"}. decoders: a subset of DECODERS (speculative needs target's outputs);
  kw: `generate_all`'s batch_size, max_new_tokens, max_input_length, seed, bar."""
  pairs = select_pairs(pairs, natural_only=natural_only, limit=limit, limit_per_domain=limit_per_domain)
  refs = [p.de for p in pairs]
  domains = np.array([p.domain for p in pairs])
  ids = encode_texts(target.tokenizer, [p.en for p in pairs],
                     max_input_length=kw.get("max_input_length", MAX_INPUT_LENGTH))
  results = {"pairs": len(pairs), "pairs_per_domain": {d: int((domains == d).sum()) for d in dict.fromkeys(domains)},
             "machine": platform.processor() or platform.machine()}
  outputs = {}
  speculation = None if draft is None else jaxspec.Speculation(draft, gamma=gamma)
  for name, model, spec in (("target", target, None), ("draft", draft, None), ("speculative", target, speculation)):
    if name not in decoders:
      continue
    start = time.time()
    run = generate_all(model, ids, spec, sampling, desc=name, **kw)
    hyps = outputs[name] = [run.texts[i] for i in range(len(pairs))]
    entry = {**scores(hyps, refs, domains), "seconds": time.time() - start}
    if spec:
      stats = run.stats
      entry.update(alpha=stats.alpha, tokens_per_iteration=stats.tokens_per_iteration,
                   acceptance_per_position=stats.acceptance_per_position.round(3).tolist())
      keeps = {d: domains == d for d in dict.fromkeys(domains)}
      if "target" in outputs:
        loops = np.array([is_repetition_loop(h) for h in outputs["target"]])
        entry["target_repetition_loops"] = int(loops.sum())
        keeps.update(without_target_loops=~loops, natural_without_target_loops=(domains == "natural") & ~loops)
      for subset, keep in keeps.items():
        if keep.any():
          entry[f"alpha_{subset}"] = stats.select(keep).alpha
    results[name] = entry
  if "target" in outputs and "speculative" in outputs:
    same = sum(a == b for a, b in zip(outputs["target"], outputs["speculative"]))
    results["speculative_identical_to_target"] = f"{same}/{len(pairs)}"
  return results


def table(results: dict) -> list[str]:
  """An aligned markdown table of `evaluate_pair`'s results: BLEU / chrF overall and per domain, alpha (overall,
  natural), tokens per iteration, seconds."""
  cell = lambda entry, key, fmt: format(entry[key], fmt) if key in entry else "-"
  domains = list(results.get("pairs_per_domain", {}))
  header = ["decoder", "BLEU / chrF"] + [f"{d} ({results['pairs_per_domain'][d]})" for d in domains]
  rows = [[name, f"{cell(e, 'bleu', '.2f')} / {cell(e, 'chrf', '.1f')}"]
          + [f"{cell(e, 'bleu_' + d, '.2f')} / {cell(e, 'chrf_' + d, '.1f')}" for d in domains]
          + [cell(e, "alpha", ".3f"), cell(e, "alpha_natural", ".3f"), cell(e, "tokens_per_iteration", ".2f"),
             cell(e, "seconds", ".1f")]
          for name, e in ((n, results[n]) for n in DECODERS if n in results)]
  return markdown_table(header + ["alpha", "alpha natural", "tok/iter", "seconds"], rows)


def all_identical(results: dict) -> bool:
  """True when every speculative output equals the target's (or when they were not both run)."""
  if "speculative_identical_to_target" not in results:
    return True
  same, total = results["speculative_identical_to_target"].split("/")
  return same == total
