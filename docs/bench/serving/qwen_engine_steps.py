"""The Qwen pair's slot engines in one process (docs/serving.md, "Qwen at concurrency 16"): 16 inserts, then 4 steps
of 4 iterations over 16 active slots, the speculative engine under qwen_table.json (its plain entry) against the
plain engine, 4 interleaved rounds. Run as it is here (the converted models under /work/models), from the
repository root: PYTHONPATH=. .venv/bin/python docs/bench/serving/qwen_engine_steps.py; its output:
qwen_engine_steps.log (measured when `insert` took `load=16`; since issue 39 every insert skips the draft's
prefill and returns the first token, so it takes no `load`)."""
"""Where the Qwen c16 gap comes from: insert and 16-row plain-entry step, speculative engine vs plain engine."""
import json, time, sys
import numpy as np, jax
import jaxspec
from jaxspec.serving import SlotEngine, SpeculationTable
from jaxspec.serving import RequestSettings

t0 = time.time()
target = jaxspec.load("/work/models/qwen15"); draft = jaxspec.load("/work/models/qwen05")
print("loaded", time.time() - t0, flush=True)
table = SpeculationTable.from_json(open("docs/bench/serving/qwen_table.json").read())
kw = dict(slots=16, max_input_length=128, max_new_tokens=48, modes=("greedy",), row_buckets=(16,))
spec = SlotEngine(target, jaxspec.Speculation(draft, gamma=4), table=table, **kw)
plain = SlotEngine(target, None, **kw)
print("spec programs", spec.programs, "plain", plain.programs, flush=True)
tok = target.tokenizer
prompts = [tok.apply_chat_template(json.loads(l)["messages"]) for l in open("docs/bench/qwen_prompts.jsonl")]
prompts = (prompts * 2)[:16]
ids = [tok.encode(p) for p in prompts]
print("lens", [len(i) for i in ids], flush=True)
ids = [i[:64] for i in ids]  # <= one bucket (64)
def fill(e):
  ts = []
  for s in range(16):
    t = time.perf_counter(); e.insert(s, ids[s], RequestSettings(max_tokens=48)); jax.block_until_ready(e._state); ts.append(time.perf_counter() - t)
  return ts
def steps(e, n):
  ts = []
  for _ in range(n):
    t = time.perf_counter(); o = e.step(); ts.append(time.perf_counter() - t)
  return ts, o
for e in (spec, plain):  # compile
  t = time.time(); fill(e); print("first fill (compile)", time.time() - t, flush=True)
  t = time.time(); steps(e, 1); print("first step (compile)", time.time() - t, flush=True)
  for s in range(16): e.free(s)
  e.step()
res = {}
for rep in range(4):
  for name, e in (("spec", spec), ("plain", plain)):
    ins = fill(e)
    st, o = steps(e, 4)
    print(rep, name, "insert med %.3f" % np.median(ins), "step med %.3f" % np.median(st), o.entry, o.rows, flush=True)
    res.setdefault(name, []).append((np.median(ins), np.median(st)))
    for s in range(16): e.free(s)
    e.step()
print(res)
