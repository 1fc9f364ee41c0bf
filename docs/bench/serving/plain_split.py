"""What the budget costs where it decodes plain (issue 39): at concurrency C in one process (64 slots, row buckets
B), plain, the budget engine held on plain (bplain: Budget(margin=9.9, probe=0), where no drafting tier ever
scores; bplain_ahead0: the same with Budget.ahead 0) and a second plain engine, 4 rounds of 96 requests, each arm
16 steps in turn. Per arm: tokens per second, and per step plan_step(), step() (with the plan it runs) and
insert() timed apart; with --split also the step's and the insert's device programs, waited for (the host's work
during the step, the plan made ahead, then runs after it), and the host's rest.
    .venv/bin/python docs/bench/serving/plain_split.py 4 4,64 [ARMS] [--split]   # C B; ARMS plain,bplain,plain2
"""
import time, json, sys, collections, jax, jaxspec
from jaxspec.serving import Budget, SlotEngine, RequestSettings
from jaxspec.serving import engine as E
target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
prompts = [target.tokenizer.encode(json.loads(l)["prompt"])[:64] for l in open("docs/bench/serving_ende.jsonl")]
spec = jaxspec.Speculation(draft, gamma=4)
args = [a for a in sys.argv[1:] if a != "--split"]
C, B, split = int(args[0]), [int(b) for b in args[1].split(",")], "--split" in sys.argv
arms = args[2].split(",") if len(args) > 2 else ["plain", "bplain", "plain2"]
kinds = {"plain": (None, False), "plain2": (None, False), "bplain": (spec, Budget(margin=9.9, probe=0.0)),
         "bplain_ahead0": (spec, Budget(margin=9.9, probe=0.0, ahead=0))}
engines = {a: SlotEngine(target, kinds[a][0], slots=64, max_input_length=64, max_new_tokens=64, modes=("greedy",),
                         budget=kinds[a][1], row_buckets=B) for a in arms}
for e in engines.values(): e.warmup()
s = RequestSettings(64, jaxspec.Sampling(0.0))
cur, stat = [None], {a: collections.Counter() for a in engines}
def timed(program, key):
  def run(*a):
    t = time.perf_counter(); out = program(*a); jax.block_until_ready(out)
    stat[cur[0]][key] += time.perf_counter() - t
    return out
  return run
if split:
  E.STEP, E.INSERT = timed(E.STEP, "dev"), timed(E.INSERT, "insdev")
for rnd in range(4):
  order = list(engines) if rnd % 2 == 0 else list(engines)[::-1]
  sent = {a: 0 for a in engines}
  def done(a): return sent[a] >= 96 and not engines[a].active_slots()
  while not all(done(a) for a in engines):
    for a in order:
      e, c = engines[a], stat[a]; cur[0] = a
      for _ in range(16):
        if done(a): break
        while sent[a] < 96 and len(e.active_slots()) < C:
          t = time.perf_counter(); out = e.insert(e.free_slots()[0], prompts[(rnd * 96 + sent[a]) % len(prompts)], s)
          c["ins"] += time.perf_counter() - t; c["tok"] += len(out.tokens); sent[a] += 1
        t = time.perf_counter(); key, limits = e.plan_step(); t1 = time.perf_counter()
        out = e.step(program=key, limits=limits)
        c["plan"] += t1 - t; c["step"] += time.perf_counter() - t1; c["n"] += 1
        c["drafting"] += int(not e.table.entries[key[0]].plain); c["tok"] += sum(len(x) for x in out.tokens)
for a, c in stat.items():
  n = c["n"]; f = lambda x: f"{1e3 * x / n:.3f}"
  line = (f"{a} tok/s {c['tok'] / (c['ins'] + c['plan'] + c['step']):.1f}  ms a step: plan {f(c['plan'])} step "
          f"{f(c['step'])} insert {f(c['ins'])}  steps {n} (drafting {c['drafting']})")
  if split:
    line += f"  | device: step {f(c['dev'])} insert {f(c['insdev'])}; host rest {f(c['step'] - c['dev'])}"
  print(line)
