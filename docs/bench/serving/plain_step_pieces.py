"""The budget's plain step program against a plain engine's, on the device alone (issue 39, twenty-second session).

At R rows of 64 slots (the embedded pair, greedy, 64 new tokens), R requests inserted into a plain engine and into
the budget's engine; then, round after round, each arm's step program runs 11 timed steps from those rows (each
round from a copy of the state after the inserts), the arms' steps interleaved one by one in a shuffled order, each
waited for. Arms: plain (a plain engine's program), budget (the budget's plain tier as the engine calls it: the
lagging draft's state left out, no limits), budget_limits (the same with the all-0 per-row limits passed, as the
engine did before 09426f3), budget_whole (the budget's plain tier gathering every position of the rows, its
loop over 69: no StepProgram.keep) and plain69 (a plain engine on caches of 69 positions, the budget's allocation, its
step gathering 65 of them). Prints each arm's median step and its median paired ratio to plain's.
    .venv/bin/python docs/bench/serving/plain_step_pieces.py 4 40      # R, rounds
"""
import dataclasses, json, random, sys, time
import numpy as np, jax, jaxspec
from jaxspec.serving import Budget, SlotEngine, RequestSettings
from jaxspec.decoding.slot_programs import STEP, without_draft
R, ROUNDS = int(sys.argv[1]), int(sys.argv[2])
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
make = lambda spec, budget: SlotEngine(target, spec, slots=64, max_input_length=64, max_new_tokens=64,
                                       modes=("greedy",), budget=budget, row_buckets=[R, 64])
engines = {"plain": make(None, None), "budget": make(jaxspec.Speculation(draft, gamma=4), Budget(margin=9.9)),
           "plain69": make(None, None)}
wide = engines["plain69"]  # the allocation of a gamma-4 budget: 4 slack positions, the plain step gathering 65
wide._alloc = dataclasses.replace(wide._alloc, gamma=4)
wide._layout, wide._state = wide._allocate()
wide._programs = {k: dataclasses.replace(p, keep=wide._layout.kept(4) if p.rows < 64 else (), axes=wide._layout.axes)
                  for k, p in wide._programs.items()}
arms = {}  # arm -> (engine, program, saved state, index, extra args)
for name, e in engines.items():
  for i in range(R):
    e.insert(e.free_slots()[0], prompts[i], RequestSettings(64, jaxspec.Sampling(0.0), ignore_eos=True))
  program = e._programs[next(k for k in e.programs if k[2] == R and e.table.entries[k[0]].plain)]
  state = without_draft(e._state)[0] if program.draft_outside else e._state
  saved = jax.tree_util.tree_map(lambda x: x.copy(), state)
  arms[name] = (e, program, saved, e._rows(R), ())
  if name == "budget":
    arms["budget_limits"] = (e, program, saved, e._rows(R), (np.zeros((R,), np.int32),))
    arms["budget_whole"] = (e, dataclasses.replace(program, keep=()), saved, e._rows(R), ())
stop, live, times = np.zeros((64,), bool), {}, {a: [] for a in arms}
def reset(a):
  live[a] = jax.tree_util.tree_map(lambda x: x.copy(), arms[a][2]); jax.block_until_ready(live[a])
def one(a):
  e, program, _, index, extra = arms[a]
  t = time.perf_counter()
  live[a], packed = STEP(program, e.target_params, e.draft_params, live[a], stop, index, *extra)
  jax.block_until_ready((live[a], packed))
  return time.perf_counter() - t
for a in arms:
  reset(a); one(a); one(a)  # compiled, warm
rng = random.Random(0)
for _ in range(ROUNDS):
  for a in arms:
    reset(a)
  for k in range(12):
    order = list(arms); rng.shuffle(order)
    for a in order:
      t = one(a)
      if k:
        times[a].append(t)
print(f"R={R}, {ROUNDS} rounds of 11 steps an arm, interleaved step by step ({jax.devices()[0].device_kind})")
for a, t in times.items():
  t = np.asarray(t)
  print(f"{a:14s} median {1e3 * np.median(t):.3f} ms  paired median / plain {np.median(t / np.asarray(times['plain'])):.3f}"
        f"  p25 {1e3 * np.percentile(t, 25):.3f} ms")
