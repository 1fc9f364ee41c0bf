"""GPU exploration (issue 16): draft-step variants, XLA command buffers, loop variants, profiles, oracle rows.

Ran once on an H100 (JAX 0.11.2) from a snapshot of commit e000a82 plus jaxspec/bench/ and this folder's
t5_variants.py, as `BUDGET_S=330 python3 explore.py` with PYTHONPATH at the snapshot's root; results in
../gpu_profile.json, ../gpu_profile.md and ../paper_speedups.*. Its loop variants exec a copy of that commit's
jaxspec/decoding/loop.py and replace `_draft` (that commit's signature), so they need that loop.py. Known slip:
the "table" section ran the base and large drafts at alpha 0.75 (`oracle_params_of` default), not the rows'.
"""

import gzip
import glob
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types

T0 = time.time()
OUT = os.environ.get("OUT", "/tmp/out")
W = "/tmp/w"
os.makedirs(W + "/traces", exist_ok=True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
RES = {}
BUDGET = float(os.environ.get("BUDGET_S", "330"))


def log(*a):
  msg = f"[{time.time() - T0:6.1f}s] " + " ".join(str(x) for x in a)
  print(msg, flush=True)
  with open(W + "/log.txt", "a") as f:
    f.write(msg + "\n")


def save():
  with open(W + "/explore.json", "w") as f:
    json.dump(RES, f, indent=1, default=str)


def left():
  return BUDGET - (time.time() - T0)


def section(name, deadline):
  def wrap(fn):
    if time.time() - T0 > deadline:
      log(f"SKIP {name} (elapsed past {deadline}s)")
      RES[name] = {"skipped": True}
      return
    log(f"== {name}")
    try:
      RES[name] = fn()
    except Exception:  # noqa: BLE001
      RES[name] = {"error": traceback.format_exc()}
      log(f"ERROR in {name}:\n{traceback.format_exc()}")
    save()
  return wrap


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxspec import presets, profiling  # noqa: E402
from jaxspec.bench import oracle  # noqa: E402
from jaxspec.bench import paper_speedups as ps  # noqa: E402
from jaxspec.decoding.device import loop as L  # noqa: E402
from jaxspec.decoding.device import sampling  # noqa: E402
from jaxspec.models import t5  # noqa: E402
import t5_variants as tv  # noqa: E402

CB = "xla_gpu_enable_command_buffer"
BASE_TYPES = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN"
GRAPH_LISTS = [BASE_TYPES + ",DYNAMIC_SLICE_FUSION,DYNAMIC_SLICE_COPY_FUSION,WHILE,CONDITIONAL",
               BASE_TYPES + ",DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL", BASE_TYPES + ",WHILE,CONDITIONAL"]
OPTS = {"default": ()}
BF16 = jnp.bfloat16
N = 128
GAMMA = 7
DRAFT_DEADLINE = float(os.environ.get("DRAFT_DEADLINE_S", "110"))
if os.environ.get("EXPLORE_TINY"):
  for k in ("t5-11b", "t5-small", "t5-base", "t5-large"):
    presets.T5_SHAPES[k] = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4)
  N = 24


@section("env", 60)
def _env():
  out = {"jax": jax.__version__, "devices": str(jax.devices()), "kind": jax.devices()[0].device_kind}
  try:
    out["smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,"
                                 "temperature.gpu", "--format=csv"], capture_output=True, text=True).stdout
  except Exception as e:  # noqa: BLE001
    out["smi"] = str(e)
  probe = {}

  def f(x):
    return jax.lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, jnp.sin(c[1]) * 2 + 1), (0, x))[1]
  graphs = None
  for cand in GRAPH_LISTS:
    try:
      jax.jit(f, compiler_options={CB: cand})(jnp.ones(8)).block_until_ready()
      graphs = cand
      break
    except Exception as e:  # noqa: BLE001
      probe[cand] = str(e)[:200]
  probe["graphs_list"] = graphs
  if graphs:
    OPTS["graphs"] = ((CB, graphs),)
    OPTS["graphs_unroll"] = ((CB, graphs), ("xla_gpu_command_buffer_unroll_loops", True))
    OPTS["graphs_min1"] = ((CB, graphs), ("xla_gpu_graph_min_graph_size", 1))
  OPTS["nographs"] = ((CB, ""),)
  for name in list(OPTS):
    if name in ("default",):
      continue
    try:
      jax.jit(f, compiler_options=dict(OPTS[name]))(jnp.ones(8)).block_until_ready()
      probe[name] = "ok"
    except Exception as e:  # noqa: BLE001
      probe[name] = str(e)[:200]
      del OPTS[name]
  out["opts"] = {k: list(v) for k, v in OPTS.items()}
  out["probe"] = probe
  log(out)
  return out


# ---------------------------------------------------------------- profiling helpers
def trace(fn, keep_as=None):
  d = tempfile.mkdtemp(dir=W)
  jax.profiler.start_trace(d, create_perfetto_trace=True)
  try:
    fn()
  finally:
    jax.profiler.stop_trace()
  paths = glob.glob(d + "/**/perfetto_trace.json.gz", recursive=True) or glob.glob(d + "/**/*.trace.json.gz",
                                                                                     recursive=True)
  with gzip.open(paths[0], "rt") as f:
    t = json.load(f)
  if keep_as:
    shutil.copy(paths[0], f"{W}/traces/{keep_as}.json.gz")
  shutil.rmtree(d, ignore_errors=True)
  return t["traceEvents"] if isinstance(t, dict) else t


def kernels(events):
  """GPU kernel events (threads named like streams on a GPU process) and a census of lines."""
  pn = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
  tn = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"}
  census = {}
  ks = []
  for e in events:
    if e.get("ph") != "X":
      continue
    p, th = pn.get(e["pid"], str(e["pid"])), tn.get((e["pid"], e.get("tid")), str(e.get("tid")))
    census[f"{p} / {th}"] = census.get(f"{p} / {th}", 0) + 1
    if ("GPU" in p or "gpu" in p) and "stream" in th.lower():
      ks.append(e)
  return ks, census


def kernel_summary(ks, per):
  """Counts and busy time per call (per = number of calls traced), top kernels by time."""
  ks = sorted(ks, key=lambda e: float(e["ts"]))
  if not ks:
    return {"kernels": 0}
  busy = sum(float(e.get("dur", 0)) for e in ks)
  span = float(ks[-1]["ts"]) + float(ks[-1].get("dur", 0)) - float(ks[0]["ts"])
  by = {}
  for e in ks:
    key = (e.get("args") or {}).get("hlo_op") or e["name"][:60]
    c, t = by.get(key, (0, 0.0))
    by[key] = (c + 1, t + float(e.get("dur", 0)))
  top = sorted(by.items(), key=lambda kv: -kv[1][1])[:40]
  return {"kernels_per_call": len(ks) / per, "busy_us_per_call": busy / per, "span_us_per_call": span / per,
          "distinct": len(by), "top": [(k, c / per, round(t / per, 2)) for k, (c, t) in top]}


# ---------------------------------------------------------------- models
S = {}


@section("small_model", 100)
def _small_model():
  t = time.time()
  S["small"], S["sparams"] = ps.random_t5("t5-small", BF16, 1)
  S["inputs"] = ps.random_inputs(2, 40, 64, 32128)
  return {"small_init_s": time.time() - t}


# ---------------------------------------------------------------- draft step micro-benchmarks
_CC = {}


def carried(options):
  if options not in _CC:
    def f(decoder, params, cache, calls):
      start = cache.positions

      def body(carry, _):
        cache, tokens = carry
        logits, cache = decoder.step(params, cache, tokens)
        return (cache, jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]), None
      tokens = jnp.full((start.shape[0], 1), 5, jnp.int32)
      (cache, tokens), _ = jax.lax.scan(body, (cache, tokens), None, length=calls)
      return cache.rollback(start), tokens
    _CC[options] = jax.jit(f, static_argnums=(0, 3), donate_argnums=2, compiler_options=dict(options) or None)
  return _CC[options]


def draft_bench(decoder, params, options=(), calls=32, repeats=7, profile=False, keep_as=None):
  ids, lens = S["inputs"][0]
  cache, _ = jax.jit(decoder.prefill, static_argnums=3)(params, ids, lens, 16 + calls + 2)
  cache = cache.rollback(jnp.full((1,), 16, jnp.int32))
  fn = carried(options)
  t = time.time()
  cache, tok = jax.block_until_ready(fn(decoder, params, cache, calls))
  compile_s = time.time() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    cache, tok = jax.block_until_ready(fn(decoder, params, cache, calls))
    times.append(time.perf_counter() - t)
  out = {"ms_per_step": statistics.median(times) / calls * 1e3, "min_ms": min(times) / calls * 1e3,
         "compile_s": compile_s}
  if profile:
    box = [cache]

    def once():
      box[0], _ = jax.block_until_ready(fn(decoder, params, box[0], calls))
    ev = trace(once, keep_as=keep_as)
    ks, census = kernels(ev)
    out["profile"] = kernel_summary(ks, calls)
    out["census"] = census
  return out


DRAFT_VARIANTS = {
    "lib": None,
    "bnch": tv.Opts(layout="bnch"),
    "qkv_reduce": tv.Opts(qkv="reduce"),
    "qkv_concat": tv.Opts(qkv="concat"),
    "fold": tv.Opts(fold=True),
    "attn_reduce_bnch": tv.Opts(layout="bnch", attn="reduce"),
    "mlp_out_reduce": tv.Opts(mlp="reduce", out="reduce"),
    "lean_dot": tv.Opts(layout="bnch", fold=True, qkv="concat"),
    "all_reduce": tv.Opts(layout="bnch", fold=True, qkv="reduce", attn="reduce", mlp="reduce", out="reduce"),
}


def variant_decoder(name, cfg):
  o = DRAFT_VARIANTS[name]
  return t5.T5Decoder(cfg) if o is None else tv.VariantDecoder(cfg, o)


@section("draft_variants", 150)
def _draft_variants():
  cfg = S["small"].config
  res = {}
  for name in DRAFT_VARIANTS:
    if time.time() - T0 > DRAFT_DEADLINE:
      break
    res[name] = draft_bench(variant_decoder(name, cfg), S["sparams"], profile=True,
                            keep_as=f"draft_{name}" if name in ("lib", "lean_dot", "all_reduce") else None)
    if name != "lib":
      res[name].pop("census", None)
    log(name, {k: v for k, v in res[name].items() if k != "profile"},
        {k: v for k, v in res[name].get("profile", {}).items() if k != "top"})
  ranked = sorted((n for n in res), key=lambda n: res[n]["ms_per_step"])
  res["ranked"] = ranked
  for oname in ("graphs", "graphs_unroll", "nographs"):
    if oname not in OPTS:
      continue
    for name in ["lib"] + ([n for n in ranked[:1] if n != "lib"] if oname == "graphs" else []):
      if time.time() - T0 > DRAFT_DEADLINE + 15:
        break
      r = draft_bench(variant_decoder(name, cfg), S["sparams"], OPTS[oname])
      res[f"{name}@{oname}"] = r
      log(f"{name}@{oname}", r)
  S["best_draft"] = ranked[0]
  return res


@section("target_model", 10000)
def _target_model():
  t = time.time()
  S["target"], S["tparams"] = ps.random_t5("t5-11b", BF16, 0)
  jax.block_until_ready(S["tparams"])
  return {"target_init_s": time.time() - t}


# ---------------------------------------------------------------- target steps
@section("target_steps", 10000)
def _target_steps():
  ids, lens = S["inputs"][0]
  t1 = ps.step_time(S["target"], S["tparams"], ids, lens, 1, calls=8, repeats=5)
  t8 = ps.step_time(S["target"], S["tparams"], ids, lens, GAMMA + 1, calls=8, repeats=5)
  d1 = ps.step_time(S["small"], S["sparams"], ids, lens, 1, calls=32, repeats=7)
  S["costs"] = {"target_step_s": t1, ("verify", GAMMA): t8, "draft_step_s": d1}
  out = {"target_ms": t1 * 1e3, "verify8_ms": t8 * 1e3, "r": t8 / t1, "small_ms": d1 * 1e3, "c": d1 / t1}
  log(out)
  save()
  if left() > 180:
    vt = tv.VariantDecoder(S["target"].config, tv.Opts(layout="bnch", fold=True))
    v1 = ps.step_time(vt, S["tparams"], ids, lens, 1, calls=8, repeats=5)
    v8 = ps.step_time(vt, S["tparams"], ids, lens, GAMMA + 1, calls=8, repeats=5)
    out["target_bnch_fold"] = {"target_ms": v1 * 1e3, "verify8_ms": v8 * 1e3, "r": v8 / v1}
    log(out)
  return out


# ---------------------------------------------------------------- loop variants
def make_loop(first: str, unroll: bool):
  mod = types.ModuleType(f"loopvar_{first}_{unroll}")
  sys.modules[mod.__name__] = mod
  exec(compile(inspect.getsource(L), mod.__name__, "exec"), mod.__dict__)

  def _draft(settings, params, cache, state, knobs, keys):
    dlen = cache.positions

    def catch_up(cache):
      tokens = jnp.take_along_axis(state.sequences, dlen[:, None] + jnp.arange(2), axis=1)
      with jax.named_scope("draft_step"):
        logits, cache = settings.draft.step(params, cache, tokens)
      return jnp.take_along_axis(logits, (state.lengths - dlen - 1)[:, None, None], axis=1)[:, 0], cache

    def caught_up(cache):
      with jax.named_scope("draft_step"):
        logits, cache = settings.draft.step(params, cache,
                                            jnp.take_along_axis(state.sequences, dlen[:, None], axis=1))
      return logits[:, 0], cache

    if first == "cond":
      behind = (dlen < state.lengths - 1) & ~state.done
      first_logits, cache = jax.lax.cond(jnp.any(behind), catch_up, caught_up, cache)
    else:
      first_logits, cache = catch_up(cache)
    cache = cache.rollback(state.lengths)
    x1, q1 = mod._propose(settings, mod._fold(keys, 0), first_logits, knobs)

    def one_step(carry, j):
      cache, token = carry
      with jax.named_scope("draft_step"):
        logits, cache = settings.draft.step(params, cache, token[:, None])
      x, q = mod._propose(settings, mod._fold(keys, j), logits[:, 0], knobs)
      return (cache, x), (x, q)

    (cache, _), (xs, qs) = jax.lax.scan(one_step, (cache, x1), jnp.arange(1, settings.gamma),
                                        unroll=bool(unroll))
    tokens = jnp.concatenate([x1[:, None], xs.T], axis=1)
    q = None if settings.greedy else jnp.concatenate([q1[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
    return tokens, q, cache

  mod._draft = _draft
  return mod


LOOPS = {"base": L}
KNOBS = sampling.SamplingKnobs.create(0.0, 0, 1.0)
Z = jnp.zeros((1,), jnp.uint32)
R0 = jnp.zeros((1,), jnp.int32)
_PRE = jax.jit(L.prefill, static_argnums=0)


def compile_loop(mod, settings, dparams, options):
  ids, lens = S["inputs"][0]
  tc, dc, first = _PRE(settings, S["tparams"], dparams, ids, lens)
  run = jax.jit(mod.run, static_argnums=0, donate_argnums=(3, 4), compiler_options=dict(options) or None)
  t = time.time()
  compiled = run.lower(settings, S["tparams"], dparams, tc, dc, first, KNOBS, Z, R0).compile()
  return compiled, time.time() - t


def decode_c(compiled, settings, dparams, ids, lens):
  t0 = time.perf_counter()
  tc, dc, first = jax.block_until_ready(_PRE(settings, S["tparams"], dparams, ids, lens))
  t1 = time.perf_counter()
  state = jax.block_until_ready(compiled(S["tparams"], dparams, tc, dc, first, KNOBS, Z, R0))
  return state, t1 - t0, time.perf_counter() - t1


def time_loop(compiled, settings, dparams_of, repeats=3):
  states = [decode_c(compiled, settings, dparams_of(i), ids, lens)[0] for i, (ids, lens) in enumerate(S["inputs"])]
  rounds = []
  for _ in range(repeats):
    parts = [decode_c(compiled, settings, dparams_of(i), ids, lens)[1:] for i, (ids, lens) in enumerate(S["inputs"])]
    rounds.append((sum(p for p, _ in parts), sum(q for _, q in parts)))
  rounds.sort(key=lambda r: r[0] + r[1])
  pre, lp = rounds[len(rounds) // 2]
  tok = sum(int(s.lengths[0]) - 1 for s in states)
  it = sum(int(s.stats.iterations[0]) for s in states)
  acc = sum(int(s.stats.accepted[0]) for s in states)
  bs = sum(float(s.stats.beta_sum[0]) for s in states)
  bc = sum(int(s.stats.beta_count[0]) for s in states)
  return {"prefill_ms": pre * 1e3, "loop_ms": lp * 1e3, "tokens": tok, "iterations": it, "accepted": acc,
          "alpha_hat": bs / max(bc, 1), "ms_per_token": (pre + lp) / tok * 1e3, "loop_ms_per_token": lp / tok * 1e3,
          "loop_ms_per_iteration": lp / it * 1e3, "rounds": rounds, "states": states}


@section("plain", 10000)
def _plain():
  settings = oracle.plain_settings(S["target"], N + GAMMA + 1)
  res = {}
  for oname in ("default", "graphs"):
    if oname not in OPTS:
      continue
    compiled, cs = compile_loop(L, settings, None, OPTS[oname])
    r = time_loop(compiled, settings, lambda i: None, repeats=2)
    states = r.pop("states")
    if oname == "default":
      S["greedy"] = [s.sequences[:, 1:1 + N + GAMMA + 1] for s in states]
    r["compile_s"] = cs
    res[oname] = r
    S[f"plain_{oname}"] = r
    log("plain", oname, r)
  return res


def oracle_params_of(dparams, alpha=0.75):
  ps_ = [oracle.oracle_params(dparams, g, np.full((1,), 7 + i, np.uint32), alpha) for i, g in enumerate(S["greedy"])]
  return lambda i: ps_[i]


def spec_settings(draft_decoder):
  return oracle.oracle_settings(S["target"], oracle.OracleDecoder(draft_decoder), GAMMA, N)


def run_spec(label, mod, draft_decoder, dparams, options, profile=False, repeats=3):
  settings = spec_settings(draft_decoder)
  compiled, cs = compile_loop(mod, settings, oracle_params_of(dparams)(0), options)
  r = time_loop(compiled, settings, oracle_params_of(dparams), repeats)
  states = r.pop("states")
  toks = [np.asarray(s.sequences[0, 1:1 + N]) for s in states]
  r["greedy_equal"] = all(np.array_equal(t, np.asarray(g[0, :N])) for t, g in zip(toks, S["greedy"]))
  r["compile_s"] = cs
  plain = S.get("plain_default")
  if plain:
    r["speedup_vs_plain_default"] = plain["ms_per_token"] / r["ms_per_token"]
    r["loop_speedup_vs_plain_default"] = plain["loop_ms_per_token"] / r["loop_ms_per_token"]
  if profile:
    ids, lens = S["inputs"][0]
    dp = oracle_params_of(dparams)(0)
    tc, dc, first = jax.block_until_ready(_PRE(settings, S["tparams"], dp, ids, lens))
    ev = trace(lambda: jax.block_until_ready(compiled(S["tparams"], dp, tc, dc, first, KNOBS, Z, R0)),
               keep_as=f"loop_{label}")
    hlo = compiled.as_text()
    with gzip.open(f"{W}/traces/loop_{label}.hlo.txt.gz", "wt") as f:
      f.write(hlo)
    cats = profiling.instruction_categories(hlo)
    ks, census = kernels(ev)
    r["census"] = census
    it = int(states[0].stats.iterations[0])
    r["profile_kernels"] = kernel_summary(ks, it)
    try:
      r["breakdown"] = {k: v for k, v in profiling.breakdown_from_trace(ev, cats, "jit_run").items()}
    except Exception as e:  # noqa: BLE001
      r["breakdown"] = str(e)
    by_cat = {}
    for e in ks:
      c = cats.get((e.get("args") or {}).get("hlo_op"), "?")
      n, t = by_cat.get(c, (0, 0.0))
      by_cat[c] = (n + 1, t + float(e.get("dur", 0)))
    r["kernels_by_category_per_iteration"] = {c: (n / it, t / it) for c, (n, t) in by_cat.items()}
  log("spec", label, {k: v for k, v in r.items() if k not in ("census", "profile_kernels")})
  return r


@section("spec_small", 10000)
def _spec_small():
  res = {}
  small = t5.T5Decoder(S["small"].config)
  sp = S["sparams"]
  res["base@default"] = run_spec("base_default", L, small, sp, OPTS["default"], profile=True)
  save()
  mods = {"base": L, "always2": make_loop("always2", False), "always2_unroll": make_loop("always2", True)}
  plan = [("always2_unroll", "default"), ("base", "graphs"), ("always2_unroll", "graphs"),
          ("always2", "default"), ("always2_unroll", "graphs_unroll")]
  for lname, oname in plan:
    if oname not in OPTS or left() < 90:
      continue
    res[f"{lname}@{oname}"] = run_spec(f"{lname}_{oname}", mods[lname], small, sp, OPTS[oname])
    save()
  best_loop = min((k for k in res), key=lambda k: res[k]["ms_per_token"])
  res["best_loop"] = best_loop
  lname, oname = best_loop.split("@")
  S["best_mod"], S["best_opts"] = mods[lname], OPTS[oname]
  bd = S.get("best_draft", "lib")
  if bd != "lib" and left() > 60:
    res[f"{bd}+{best_loop}"] = run_spec(f"lean_{bd}", mods[lname], variant_decoder(bd, S["small"].config), sp,
                                        OPTS[oname], profile=True)
  return res


@section("table", BUDGET - 70)
def _table():
  rows = [presets.paper_row(n) for n in ("ende_base_t0", "ende_large_t0")]
  res = {}
  ids, lens = S["inputs"][0]
  bd = S.get("best_draft", "lib")
  for row in rows:
    if left() < 35:
      break
    shape = f"t5-{row.draft}"
    dec, dp = ps.random_t5(shape, BF16, 1)
    d1 = ps.step_time(dec, dp, ids, lens, 1, calls=16, repeats=5)
    vdec = variant_decoder(bd, dec.config)
    r = run_spec(f"{row.draft}", S.get("best_mod", L), vdec, dp, S.get("best_opts", ()), repeats=2)
    r["draft_step_ms_lib"] = d1 * 1e3
    r["c_lib"] = d1 / S["costs"]["target_step_s"] if "costs" in S else None
    res[shape] = r
    save()
  return res


def finish():
  try:
    RES["smi_end"] = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,"
                                     "memory.used", "--format=csv"], capture_output=True, text=True).stdout
  except Exception:  # noqa: BLE001
    pass
  save()
  shutil.copy(W + "/explore.json", OUT + "/explore.json")
  subprocess.run(["tar", "czf", OUT + "/traces.tgz", "-C", W, "traces", "log.txt"])
  log("done", os.listdir(OUT))


finish()
