"""The budget's plain-tier step program against a plain engine's, as compiled HLO (issue 39, twenty-sixth session).

At R rows of 64 slots (the embedded pair, greedy, 64 new tokens), the two engines' plain step programs are lowered
and compiled (nothing runs). The script writes each program's optimized HLO to OUT_DIR/hlo_{plain,budget}_R.txt
and prints its instruction count and the HLO opcodes whose counts differ.
    .venv/bin/python docs/bench/serving/plain_tier_hlo.py 16 /tmp      # R, OUT_DIR
"""
import collections, os, re, sys
import numpy as np, jaxspec
from jaxspec.serving import Budget, SlotEngine
from jaxspec.decoding.slot_programs import STEP, without_draft
R, OUT = int(sys.argv[1]), sys.argv[2]
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
make = lambda spec, budget: SlotEngine(target, spec, slots=64, max_input_length=64, max_new_tokens=64,
                                       modes=("greedy",), budget=budget, row_buckets=[R, 64])
counts = {}
for name, e in {"plain": make(None, None), "budget": make(jaxspec.Speculation(draft, gamma=4), Budget(margin=9.9))}.items():
  program = e._programs[next(k for k in e.programs if k[2] == R and e.table.entries[k[0]].plain)]
  state = without_draft(e._state)[0] if program.draft_outside else e._state
  text = STEP.lower(program, e.target_params, e.draft_params, state, np.zeros((64,), bool), e._rows(R)).compile().as_text()
  with open(os.path.join(OUT, f"hlo_{name}_{R}.txt"), "w") as f:
    f.write(text)
  counts[name] = collections.Counter(m.group(1) for m in re.finditer(r"= \S+ (\w[\w-]*)\(", text))
  print(f"{name}: {sum(counts[name].values())} instructions")
for op in sorted(set(counts["plain"]) | set(counts["budget"])):
  if counts["plain"][op] != counts["budget"][op]:
    print(f"{op:24s} plain {counts['plain'][op]:5d}  budget {counts['budget'][op]:5d}")
