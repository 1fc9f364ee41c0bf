"""Instruction counts of the optimised HLO of the decoding loop that `generate` compiles, per kind of call.

    PYTHONPATH=. python docs/bench/hlo_counts.py OUT.json

Run against two checkouts (each with PYTHONPATH at its root) to show that a refactor compiles the same loop:
docs/bench/hlo_counts.md. It speaks both call shapes (before the typed settings: generate's keyword arguments and
engine.compiled_loop_hlo; after: jaxspec.Speculation / jaxspec.Sampling and jaxspec.lower).
"""

import collections
import json
import re
import sys

import jaxspec

CASES = {"plain": {}, "plain_t1": dict(temperature=1.0), "constant_greedy": dict(gamma=4),
         "constant_t1": dict(gamma=4, temperature=1.0)}


def loop_hlo(target, draft, prompts, gamma=None, temperature=0.0) -> str:
  if hasattr(jaxspec, "Speculation"):
    spec = None if gamma is None else jaxspec.Speculation(draft, gamma=gamma)
    return jaxspec.lower(target, prompts, spec, jaxspec.Sampling(temperature), max_new_tokens=16).loop_hlo()
  from jaxspec.decoding.engine import compiled_loop_hlo  # the call shape before the typed settings
  kw = {} if gamma is None else dict(draft=draft, gamma=gamma)
  return compiled_loop_hlo(target, prompts, max_new_tokens=16, temperature=temperature, **kw)


def main(out: str) -> None:
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  prompts = ["translate English to German: The house is small."] * 2
  counts = {}
  for name, kw in CASES.items():
    hlo = loop_hlo(target, draft, prompts, **kw)
    ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+(?:ROOT )?\S+ = .*? ([a-z][\w-]*)\(", hlo, re.M))
    counts[name] = {"total": sum(ops.values()), "while": ops["while"], "fusion": ops["fusion"], "copy": ops["copy"]}
    print(name, counts[name], flush=True)
  with open(out, "w") as f:
    json.dump(counts, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
