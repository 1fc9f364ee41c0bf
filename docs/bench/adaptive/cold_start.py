r"""How often schedule="adaptive" rests rows of a good draft (statistics only, no timing).

    nice -n 5 .venv/bin/python docs/bench/adaptive/cold_start.py     # output: cold_start.txt

Temperature 0, batch 1, the embedded pair, the first 16 natural dev sentences, gamma 4, the knobs the tuner chose
for that gamma in pair_no_prior/tune.json (draft_cost 0.11, fallback_alpha 0.471). Per sentence: whether the
draft's FIRST proposal was rejected (constant gamma 4: the first streamed chunk holds 1 token), and the iterations
the row rested under adaptive with those knobs. Written to check the cold start of the running estimate: before
adaptive.PRIOR_POSITIONS existed a first-position rejection set a = 0 and the row rested; cold_start.txt was
produced with the prior (a = 0.64 after such a rejection).
"""

import numpy as np

import jaxspec
from jaxspec.data.ende import read_pairs, split_path
from jaxspec.tools.inputs import encode_texts

target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
texts = [p.en for p in read_pairs(split_path("dev")) if p.is_natural][:16]
ids = encode_texts(target.tokenizer, texts, max_input_length=512)
rows = []
for i in ids:
  chunks = []
  jaxspec.generate(target, [i], jaxspec.Speculation(draft, gamma=4), on_tokens=chunks.append)
  no_fallback_spec = jaxspec.Speculation(draft, gamma=4, schedule="adaptive", draft_cost=0.11)
  adaptive = jaxspec.generate(target, [i], no_fallback_spec.replace(fallback_alpha=0.471))
  no_fallback = jaxspec.generate(target, [i], no_fallback_spec)
  rows.append((int(chunks[0].counts[0]) == 1, int(adaptive.lengths[0]), int(adaptive.stats.iterations[0]),
               int(adaptive.stats.fallback_iterations[0]), int(no_fallback.stats.iterations[0])))
print("first proposal rejected | tokens | adaptive iterations | of them resting | iterations without fallback")
for r in rows:
  print(" | ".join(map(str, r)))
first = np.array([r[0] for r in rows])
rest = np.array([r[3] for r in rows])
print(f"sentences whose first proposal was rejected: {first.sum()} of {len(rows)}; resting iterations: "
      f"{rest[first].sum()} in those, {rest[~first].sum()} in the others; total {rest.sum()} of "
      f"{sum(r[2] for r in rows)} iterations")
