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
# Token trees (the draft model's dynamic tree, verified in one call) and a feature head (a T5 target's EAGLE-3
# head, random weights: the program, not its acceptance, is counted), chains and trees. Absent before the trees.
TREE_CASES = {"tree_greedy": dict(gamma=3, tree=(2, 6)), "tree_t1": dict(gamma=3, tree=(2, 6), temperature=1.0),
              "head_greedy": dict(gamma=3, head=True), "head_t1": dict(gamma=3, head=True, temperature=1.0),
              "head_tree_greedy": dict(gamma=3, head=True, tree=(2, 6))}


def _head(target):
  """A random EAGLE-3 head for the T5 target (cross-attention to its encoder), as `jaxspec.load` would give."""
  import jax  # pylint: disable=import-outside-toplevel
  from jaxspec.models import eagle3  # pylint: disable=import-outside-toplevel
  c = target.config
  cfg = eagle3.Eagle3Config(vocab_size=c.vocab_size, draft_vocab_size=min(c.vocab_size, 4096), hidden_size=c.d_model,
                            target_hidden_size=c.d_model, intermediate_size=2 * c.d_model, num_heads=4,
                            num_kv_heads=2, head_dim=c.d_model // 4, aux_layer_ids=(0, 1, 2),
                            encoder_hidden_size=c.d_model)
  return jaxspec.FeatureHead(cfg, eagle3.init_params(cfg, jax.random.PRNGKey(0)), name="random-t5-head")


def loop_hlo(target, draft, prompts, gamma=None, temperature=0.0, tree=None, head=False) -> str:
  if hasattr(jaxspec, "Speculation"):
    draft = _head(target) if head else draft
    tree = None if tree is None else jaxspec.Tree(*tree)
    spec = None if gamma is None else jaxspec.Speculation(draft, gamma=gamma, tree=tree)
    return jaxspec.lower(target, prompts, spec, jaxspec.Sampling(temperature), max_new_tokens=16).loop_hlo()
  from jaxspec.decoding.engine import compiled_loop_hlo  # the call shape before the typed settings
  kw = {} if gamma is None else dict(draft=draft, gamma=gamma)
  return compiled_loop_hlo(target, prompts, max_new_tokens=16, temperature=temperature, **kw)


def main(out: str) -> None:
  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  prompts = ["translate English to German: The house is small."] * 2
  counts = {}
  cases = dict(CASES, **(TREE_CASES if hasattr(jaxspec, "Tree") else {}))
  for name, kw in cases.items():
    hlo = loop_hlo(target, draft, prompts, **kw)
    ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+(?:ROOT )?\S+ = .*? ([a-z][\w-]*)\(", hlo, re.M))
    counts[name] = {"total": sum(ops.values()), "while": ops["while"], "fusion": ops["fusion"], "copy": ops["copy"]}
    print(name, counts[name], flush=True)
  with open(out, "w") as f:
    json.dump(counts, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
