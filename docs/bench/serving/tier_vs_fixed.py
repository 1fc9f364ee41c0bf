"""The budget's gamma-4 tier program against a fixed gamma-4 engine's step at one row (the 2-row bucket), interleaved
step by step in one process (issue 39, thirty-first session): whether the budget's drafting program (the variable-
length draft path, a `lax.cond` around it, a re-feed branch in the catch-up, the estimates' update) costs more on
the device than the fixed engine's (the constant path). One request at a time in each engine (64 tokens,
ignore_eos), STEPS steps each; medians after the first 10. VARIANT patches the budget's drafter before its programs
are traced: base (as the library is), cond (no `lax.cond` around the drafting), refeed (no re-feed branch), wide
(the catch-up's 1- and 2-token calls alone).

    .venv/bin/python docs/bench/serving/tier_vs_fixed.py VARIANT STEPS     # e.g. base 200
"""
import json, time, statistics, sys
import numpy as np, jaxspec
from jaxspec.decoding.drafters import model_drafter
variant = sys.argv[1]
if "cond" in variant:  # no lax.cond around the drafting: the served draft's inner proposal told some row drafts
  # (the fixed engine's constant path, limit None, does not read it)
  from jaxspec.decoding.drafters import chain
  inner_propose = chain.LearnedDrafter.propose
  chain.LearnedDrafter.propose = lambda self, request: inner_propose(self, request._replace(some_row_drafts=True))
if variant in ("refeed", "wide"):  # the catch-up without its re-feed branch (wide: without its gamma + 1 call too)
  begin = model_drafter.ModelDrafter._begin
  def _begin(self, params, cache, history, static, needed, variable, refeed):  # pylint: disable=unused-argument
    return begin(self, params, cache, history, static, needed, variable and variant == "refeed", False)
  model_drafter.ModelDrafter._begin = _begin
from jaxspec.serving import Budget, RequestSettings, SlotEngine
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
spec = jaxspec.Speculation(draft, gamma=4)
settings = RequestSettings(64, jaxspec.Sampling(0.0), ignore_eos=True)
kw = dict(slots=8, max_input_length=64, max_new_tokens=64, modes=("greedy",), row_buckets=[2, 8])
eng = {"budget": SlotEngine(target, spec, budget=Budget(repeats=1), **kw),
       "fixed": SlotEngine(target, spec, budget=False, **kw)}
b = eng["budget"]; k4 = [i for i, t in enumerate(b.table.entries) if t.gamma == 4][0]
times = {"budget k4": [], "fixed": []}
i = 0; outs = {"budget k4": [], "fixed": []}
for it in range(int(sys.argv[2])):
  for name in times:
    e = eng[name.split()[0]]
    if not e.active_slots():
      e.insert(e.free_slots()[0], prompts[i % len(prompts)], settings); i += 1
    t = time.perf_counter()
    if name == "budget k4":
      lim = np.zeros((8,), np.int32); lim[e.active_slots()] = 4
      o = e.step(program=(k4, "greedy", 2), limits=lim)
    else:
      o = e.step()
    times[name].append(time.perf_counter() - t); outs[name].append(sum(map(len, o.tokens)))
r = {k: statistics.median(v[10:]) for k, v in times.items()}
print(variant, {k: f"{1e3*v:.2f} ms" for k, v in r.items()}, f"ratio {r['budget k4']/r['fixed']:.3f}", "tokens",
      {k: sum(v) for k, v in outs.items()})
