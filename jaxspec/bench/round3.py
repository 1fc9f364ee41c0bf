"""Issue 32's GPU measurements in one prepared run (launch/gpu_round3.py; docs/accelerator.md): the oracle loop at
the paper's and EAGLE-3's acceptance, the draft step's kernels with XLA's command buffers on and off, XLA's
autotune level against the train step's compile and step time. A benchmark tool, not library API.

Every measurement uses random weights of the real shapes (bfloat16 on an accelerator, float32 on the CPU) and
`oracle.OracleDrafter`, so acceptance is designed and the costs are the real drafters': the draft model's, the
feature head's (EAGLE-3 for a Llama-3.1-8B shape, a T5 head for t5-11b), their trees. `tiny=True` swaps in
tiny shapes of the same families (the CPU test of the script).

`run(Round3Settings(...))` runs the stages in order of value (`stages` picks; each is skipped when less than its
minimum, MIN_S, is left of `budget_s`):
  oracle    the paper's EnDe small row (t5-11b target, t5-small draft, gamma 7, alpha 0.75: chain, tree, T5 head
            copied and slim) and a Llama-3.1-8B-shaped target with an EAGLE-3 head at 6.1 tokens per iteration
            (tree and chain): ms per token against plain greedy decoding, measured acceptance against the design
            (`ende_cases`, `llama_cases`, `run_cases`);
  slots     the slot engine's step programs on the 8B shape with an EAGLE-3 head at 1 / 4 / 16 / 64 rows: plain,
            chains of 2 / 4 / 7, and the verification budget's choice at tau 6.1 (`slot_steps`);
  kernels   the t5-small step's kernels and ms, and the 8B head's ms, with XLA's command buffers as they are, off,
            and on for every kind (a process each: XLA reads its flags once; `kernel_variants`);
  autotune  the v2 target's two train programs compiled at --xla_gpu_autotune_level 4 (default) and 0: compile
            seconds and ms per step (does level 0 shorten compiles without slowing steps? `autotune_levels`);
  pair      bash launch/train_pair_gpu.sh --deadline_s=<what is left> (run from the repository, with runs/corpus
            and runs/wheels there).
It writes OUT/round3.json (machine, versions, command, every result, compiled programs per stage: `environment`)
and OUT/round3.md (the tables: `markdown`), both rewritten after every stage, and the pair's files under OUT/pair/;
a stage's exception is recorded under "errors" and the next stage runs.

Shapes: B batch (1 here), S prompt length, N generated tokens.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.bench import oracle, presets, timing
from jaxspec.decoding.drafters import registry
from jaxspec.decoding.drafters.model_drafter import ModelDrafter
from jaxspec.decoding.settings import Tree
from jaxspec.errors import ConfigError
from jaxspec.models import eagle3, t5
from jaxspec.models.decoder_only.llama import LlamaConfig
from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec.tools.outputs import atomic_write_json
from jaxspec.training.head import head_config, t5_head_config

EAGLE3_TAU = 6.13  # EAGLE-3 (Li et al. 2025), Llama-3.1-8B, MT-bench, temperature 0: tokens per target call
EAGLE3_SPEEDUP = 4.40  # its speedup there
LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                num_kv_heads=8, head_dim=128, eos_ids=(128009,), pad_token_id=0, bos_token_id=128000)
LLAMA_TINY = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                  head_dim=8, eos_ids=(1,), pad_token_id=0, bos_token_id=None)
T5_TINY = {"target": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4),
           "draft": dict(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)}
T5_VOCAB = 32128


class CompileCounter:
  """Counts XLA backend compilations (and their seconds) while active: `with counter.stage("name"): ...`."""

  def __init__(self):
    self.count, self.seconds, self.stages, self._on = 0, 0.0, {}, False
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, name, seconds, **_):
    if self._on and name == "/jax/core/compile/backend_compile_duration":
      self.count, self.seconds = self.count + 1, self.seconds + seconds

  def stage(self, name: str):
    counter = self

    class _Stage:
      def __enter__(self):
        counter._on, self.start = True, (counter.count, counter.seconds)
        return self

      def __exit__(self, *exc):
        counter.stages[name] = {"programs": counter.count - self.start[0],
                                "compile_s": round(counter.seconds - self.start[1], 2)}
        return False

    return _Stage()


def _dtype():
  return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def chain_alpha_for(tau: float, gamma: int) -> float:
  """The alpha at which a chain of gamma drafts makes tau tokens per iteration: (1 - a^(g+1)) / (1 - a) = tau."""
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if (1 - mid ** (gamma + 1)) / (1 - mid) < tau else (lo, mid)
  return (lo + hi) / 2


def _time_decode(settings, target_params, draft_params, ids, lengths, repeats: int) -> float:
  run = lambda: oracle.decode(settings, target_params, draft_params, ids, lengths)
  return timing.median_time(run, repeats, warmup=1)


@dataclasses.dataclass
class Case:
  """One oracle measurement: a drafter on a target, chain (alpha) or tree (accepted per iteration)."""

  name: str
  drafter: object  # the inner drafter (ModelDrafter, HeadDrafter, CrossHeadDrafter)
  params: object  # its params
  gamma: int
  alpha: float = 0.0
  accepted: float = 0.0
  tree: Tree | None = None
  paper: dict | None = None  # the published numbers beside it


def run_cases(target: jaxspec.Model, cases: list[Case], *, prompt_len: int, max_new_tokens: int, repeats: int,
              counter: CompileCounter, seed: int = 0) -> list[dict]:
  """Plain greedy decoding and each case's oracle loop at batch 1 on one random prompt: ms per token, speedup,
  the measured acceptance next to the design, the compiled programs per case."""
  decoder, vocab = target.decoder(), target.config.vocab_size
  ids = jnp.asarray(np.random.RandomState(seed).randint(3, min(vocab, 32000), size=(1, prompt_len)), jnp.int32)
  lengths = jnp.full((1,), prompt_len, jnp.int32)
  seeds = np.asarray([seed + 7], np.uint32)
  plain_tokens = max_new_tokens + 16  # also the oracle's answer key: >= max_new_tokens + gamma + 1
  with counter.stage(f"{target.name}:plain"):  # one program for the key and the plain timing
    greedy = oracle.greedy_tokens(decoder, target.params, ids, lengths, plain_tokens)
    plain = _time_decode(oracle.plain_settings(decoder, plain_tokens), target.params, None, ids, lengths,
                         repeats) / plain_tokens * max_new_tokens  # seconds for max_new_tokens tokens
  rows = [{"case": "plain", "target": target.name, "ms_per_token": plain / max_new_tokens * 1e3,
           **counter.stages[f"{target.name}:plain"]}]
  print(json.dumps(rows[-1]), flush=True)
  for case in cases:
    drafter = oracle.OracleDrafter(case.drafter, vocab)
    settings = oracle.drafter_settings(decoder, drafter, case.gamma, max_new_tokens, case.tree)
    params = oracle.drafter_params(case.params, greedy, seeds, alpha=case.alpha, accepted=case.accepted)
    with counter.stage(case.name):
      state = oracle.decode(settings, target.params, params, ids, lengths)
      same = bool(np.array_equal(np.asarray(state.sequences)[:, 1:1 + max_new_tokens],  # host slices: no
                                 np.asarray(greedy)[:, :max_new_tokens]))  # programs beside the loop's
      seconds = _time_decode(settings, target.params, params, ids, lengths, repeats)
    measured = oracle.measured_acceptance(jax.device_get(state.stats), case.gamma)
    design = ({"alpha": case.alpha, "tokens_per_iteration": (1 - case.alpha ** (case.gamma + 1)) / (1 - case.alpha)
               if case.alpha < 1 else case.gamma + 1} if case.tree is None else
              {"tokens_per_iteration": 1 + min(case.accepted, case.gamma)})
    row = {"case": case.name, "target": target.name, "gamma": case.gamma,
           "tree": None if case.tree is None else dataclasses.asdict(case.tree), "design": design,
           "measured": measured, "identical_to_plain": same, "ms_per_token": seconds / max_new_tokens * 1e3,
           "speedup": plain / seconds, "paper": case.paper, **counter.stages[case.name]}
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def _t5_head(target: jaxspec.Model, dtype, **sizes) -> jaxspec.FeatureHead:
  cfg = t5_head_config(target.config, target.config.vocab_size, **sizes)
  return jaxspec.FeatureHead(cfg, eagle3.init_params(cfg, jax.random.key(3), dtype), name="t5-head")


def ende_cases(tiny: bool, max_new_tokens: int) -> tuple[jaxspec.Model, list[Case]]:
  """The paper's EnDe small row (Table 2: t5-11b / t5-small, gamma 7, alpha 0.75, 3.4x): the draft model's
  chain and tree, the T5 head with the target's width (copied) and one sized for drafting."""
  dtype, row = _dtype(), presets.paper_row("ende_small_t0")
  if tiny:
    target = jaxspec.Model.random(t5.T5Config(vocab_size=T5_VOCAB, **T5_TINY["target"]), 0, dtype, name="t5-tiny")
    draft = jaxspec.Model.random(t5.T5Config(vocab_size=T5_VOCAB, **T5_TINY["draft"]), 1, dtype, name="t5-tiny-d")
    slim = dict(intermediate_size=32, num_heads=2, head_dim=8)
  else:
    target = jaxspec.Model.random(t5.T5Config(vocab_size=T5_VOCAB, **T5_SHAPES["t5-11b"]), 0, dtype, name="t5-11b")
    draft = jaxspec.Model.random(t5.T5Config(vocab_size=T5_VOCAB, **T5_SHAPES["t5-small"]), 1, dtype,
                                 name="t5-small")
    slim = dict(intermediate_size=2816, num_heads=16, head_dim=64)
  gamma, alpha = row.gamma, row.alpha
  paper = {"alpha": row.alpha, "gamma": row.gamma, "c": row.c, "speedup": row.speedup, "expected": row.exp}
  tau = (1 - alpha ** (gamma + 1)) / (1 - alpha)
  model_drafter = ModelDrafter(draft.decoder())
  cases = [Case("ende_small:t5-small chain", model_drafter, draft.params, gamma, alpha=alpha, paper=paper),
           Case("ende_small:t5-small tree(4,16) at the chain's tau", model_drafter, draft.params, gamma,
                accepted=tau - 1, tree=Tree(top_k=4, nodes=16), paper=paper)]
  for label, sizes in (("copied", {}), ("slim", slim)):
    head = _t5_head(target, dtype, **sizes)
    drafter, params = registry.head_drafter(target, head)
    cases.append(Case(f"ende_small:t5 head ({label}: d_ff {head.config.intermediate_size}, "
                      f"{head.config.num_heads} heads) chain", drafter, params, gamma, alpha=alpha, paper=paper))
  return target, cases


def successor_weights(model: jaxspec.Model, low: int, high: int) -> jaxspec.Model:
  """`model` (a decoder-only family) with the same shapes and work per token, reweighted so that its greedy next
  token after t is t + 1 (wrapping within [low, high)) by a margin far above bfloat16's rounding.

  Random weights of a 128k vocabulary put the top logits within bfloat16's rounding of each other, so a verify of
  gamma + 1 tokens and a 1-token step pick different tokens (REFERENCE.md, pitfall 8): on the H200 of 2026-11-28
  the 8B-shaped target diverged from the oracle's answer key within its first tokens (docs/accelerator.md). Here
  the output projections (attention `o`, MLP `down`) are zeroed (the dense kernels run as before: none skips
  zeros), so the residual stream is the input token's embedding E[t], and `lm_head[:, t + 1] = E[t]`: the right
  logit is about hidden_size * std against the others' sqrt(hidden_size) * std. (Scaling them by 0.05 instead
  still let 32 random layers swamp E[t]: at hidden size 1024 the greedy tokens followed t + 1 at 15 of 16 steps
  with margins under 1.) Ids outside [low, high) get zero columns and are never chosen.
  """
  params = model.params
  embedding = params["embedding"]  # [V, D]
  ids = np.arange(low, high)
  successor = low + (ids - low + 1) % (high - low)
  lm_head = jnp.zeros_like(params["lm_head"]).at[:, successor].set(embedding[ids].T)  # [D, V]
  layers = [{**layer, "attention": {**layer["attention"], "o": jnp.zeros_like(layer["attention"]["o"])},
             "mlp": {**layer["mlp"], "down": jnp.zeros_like(layer["mlp"]["down"])}} for layer in params["layers"]]
  return dataclasses.replace(model, params={**params, "layers": layers, "lm_head": lm_head})


def llama_with_head(tiny: bool) -> tuple[jaxspec.Model, jaxspec.FeatureHead]:
  """The Llama-3.1-8B-shaped target (`successor_weights` over the prompts' ids, [3, 32000): run_cases) and an
  EAGLE-3 head for it (32k draft vocabulary; tiny shapes with `tiny`), random weights in `_dtype()`."""
  dtype = _dtype()
  cfg = LlamaConfig(**(LLAMA_TINY if tiny else LLAMA_8B))
  target = successor_weights(jaxspec.Model.random(cfg, 0, dtype, name="llama-tiny" if tiny else "llama-3.1-8b-shape"),
                             low=3, high=min(cfg.vocab_size, 32000))
  hcfg = head_config(cfg, 64 if tiny else 32000)
  return target, jaxspec.FeatureHead(hcfg, eagle3.init_params(hcfg, jax.random.key(2), dtype), name="eagle3")


def llama_cases(tiny: bool) -> tuple[jaxspec.Model, list[Case]]:
  """A Llama-3.1-8B-shaped target with an EAGLE-3 head (32k draft vocabulary) at EAGLE-3's accepted length:
  its tree (top_k 8, 60 nodes, depth 7) and a chain at the alpha that gives the same tokens per iteration. The
  target's weights are `successor_weights`: random ones tie in bfloat16 and leave the oracle's answer key."""
  target, head = llama_with_head(tiny)
  drafter, params = registry.head_drafter(target, head)
  gamma = 7
  paper = {"tau": EAGLE3_TAU, "speedup": EAGLE3_SPEEDUP, "source": "EAGLE-3, Llama-3.1-8B, MT-bench, T=0"}
  tree = Tree(top_k=4, nodes=12) if tiny else Tree(top_k=8, nodes=60)
  return target, [
      Case("llama8b:eagle3 tree at tau 6.1", drafter, params, gamma, accepted=6.1 - 1, tree=tree, paper=paper),
      Case("llama8b:eagle3 chain at tau 6.1", drafter, params, gamma, alpha=chain_alpha_for(6.1, gamma),
           paper=paper)]


# --- The slot engine's step on the 8B shape (issue 41 item 3) ---------------------------------------------------

def slot_steps(tiny: bool, levels=(1, 4, 16, 64), gamma: int = 7, tau: float = 6.1, repeats: int = 3,
               tiers=(0, 2, 4, 7)) -> dict:
  """The slot engine's step programs on the 8B-shaped target (`successor_weights`) with an EAGLE-3 head: one engine
  with the verification budget over `tiers` (draft lengths, 0 = plain) at row buckets `levels` (slots: the
  largest), whose warm-up times every (rows R, draft length k) step program as the server's does (`CostCurves`,
  the median of `repeats`; a step is the engine's 4 loop iterations). Tokens per second per level and tier follow
  from those measured seconds and a designed acceptance: a chain at the per-position alpha that gives `tau` tokens
  per iteration at `gamma` (`chain_alpha_for`: random head weights accept nothing, so the acceptance is designed,
  as in the oracle stage); the budget's choice is `budget.choose` on those estimates and the measured curves."""
  from jaxspec.serving import Budget, SlotEngine
  from jaxspec.serving.budget import choose
  target, head = llama_with_head(tiny)
  budget = Budget(tiers=tuple(tiers), repeats=repeats)
  started = time.time()
  engine = SlotEngine(target, jaxspec.Speculation(head, gamma=gamma), slots=max(levels), max_input_length=16,
                      max_new_tokens=64, modes=("greedy",), budget=budget, row_buckets=list(levels))
  engine.warmup()
  iterations, ks = 4, budget.tiers_for(gamma)
  alpha = chain_alpha_for(tau, gamma)
  per_iteration = {k: (1 - alpha ** (k + 1)) / (1 - alpha) for k in ks}  # a chain of k drafts at alpha
  rows = []
  for r in engine.row_buckets:
    seconds = [engine.costs.get(r, k) for k in ks]
    rates = {k: r * iterations * per_iteration[k] / s for k, s in zip(ks, seconds)}
    pick = choose(np.full((r, gamma), alpha), ks, seconds, budget.theta, iterations=iterations)
    rows.append({"rows": r, "step_ms": {k: s * 1e3 for k, s in zip(ks, seconds)},
                 "tokens_per_s": rates, "budget_k": pick.k, "budget_tokens_per_s": rates[pick.k],
                 "best_k": max(rates, key=rates.get), "budget_over_plain": rates[pick.k] / rates[0]})
    print(json.dumps(rows[-1]), flush=True)
  return {"gamma": gamma, "tau": tau, "alpha": alpha, "iterations_per_step": iterations, "tiers": list(ks),
          "step_programs": len(engine.programs), "engine_s": round(time.time() - started, 1),
          "curves": engine.costs.lines(), "levels": rows}


# --- Kernels per draft step (command buffers, fusion flags) -------------------------------------------------------

KERNEL_OPS = ("fusion", "custom-call", "copy", "dot", "convolution", "all-reduce", "sort", "scatter", "gather",
              "dynamic-update-slice", "dynamic-slice", "reduce", "transpose", "broadcast", "select", "concatenate")


def kernel_count(hlo: str) -> dict:
  """Instructions of the optimised HLO's entry computation that launch work on a GPU (fusions, custom calls,
  unfused ops), and command-buffer regions (XLA wraps captured kernels in `command_buffer` calls)."""
  entry = hlo[hlo.find("ENTRY"):]
  entry = entry[:entry.find("\n}\n") if "\n}\n" in entry else len(entry)]
  ops = re.findall(r"=\s*\S+\s+([a-z][\w-]*)\(", entry)
  launches = [o for o in ops if o in KERNEL_OPS]
  return {"entry_instructions": len(ops), "launching": len(launches),
          "fusions": sum(o == "fusion" for o in ops), "custom_calls": sum(o == "custom-call" for o in ops),
          "command_buffers": hlo.count("command_buffer"), "whiles": sum(o == "while" for o in ops)}


def draft_step_probe(tiny: bool, repeats: int) -> dict:
  """The t5-small decoder's 1-token step and the EAGLE-3 head's step (Llama-3.1-8B shape): kernels in the
  compiled program and ms per step (median of `repeats` timed loops of 16 steps)."""
  from jaxspec.bench import costs
  dtype, out = _dtype(), {}
  shape = T5_TINY["draft"] if tiny else T5_SHAPES["t5-small"]
  small = jaxspec.Model.random(t5.T5Config(vocab_size=T5_VOCAB, **shape), 1, dtype, name="t5-small")
  decoder = small.decoder()
  ids = jnp.asarray(np.random.RandomState(0).randint(3, 1000, size=(1, 16)), jnp.int32)
  cache = decoder.prefill(small.params, ids, jnp.full((1,), 16, jnp.int32), 64).cache
  tokens = jnp.zeros((1, 1), jnp.int32)
  step = jax.jit(lambda p, c: decoder.step(p, c, tokens).logits)
  out["t5_small_step"] = {**kernel_count(step.lower(small.params, cache).compile().as_text()),
                          "ms": costs.decoder_step_time(small, 1, 1, repeats=repeats) * 1e3}
  cfg = LlamaConfig(**(LLAMA_TINY if tiny else LLAMA_8B))
  target = jaxspec.Model.random(cfg, 0, dtype, name="llama")
  hcfg = head_config(cfg, 64 if tiny else 32000)
  head = jaxspec.FeatureHead(hcfg, eagle3.init_params(hcfg, jax.random.key(2), dtype), name="eagle3")
  out["eagle3_head_step"] = {"ms": costs.head_step_time(target, head, 1, repeats=repeats) * 1e3}
  out["target_step_ms"] = costs.decoder_step_time(target, 1, 1, repeats=repeats) * 1e3
  return out


KERNEL_VARIANTS = {  # XLA_FLAGS added per variant (each in its own process: flags are read at backend start)
    "default": "",
    "no_command_buffers": "--xla_gpu_enable_command_buffer=",
    "command_buffers_all": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,COLLECTIVES,"
                           "CONDITIONAL,WHILE --xla_gpu_graph_min_graph_size=1",
    "autotune_0": "--xla_gpu_autotune_level=0",
}


def _subprocess(args: list[str], extra_flags: str, timeout: float) -> dict:
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + extra_flags).strip()
  t = time.time()
  try:
    res = subprocess.run([sys.executable, "-m", "jaxspec.bench.round3"] + args, env=env, capture_output=True,
                         text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s", "xla_flags": env["XLA_FLAGS"]}
  lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
  if res.returncode != 0 or not lines:
    return {"error": res.stderr[-1500:], "xla_flags": env["XLA_FLAGS"]}
  return {**json.loads(lines[-1]), "xla_flags": env["XLA_FLAGS"], "process_s": round(time.time() - t, 1)}


def kernel_variants(tiny: bool, repeats: int, timeout: float, variants=None) -> dict:
  """`draft_step_probe` under each of KERNEL_VARIANTS' XLA flags (a process each)."""
  args = ["probe"] + (["--tiny"] if tiny else []) + [f"--repeats={repeats}"]
  return {name: _subprocess(args, KERNEL_VARIANTS[name], timeout) for name in (variants or KERNEL_VARIANTS)}


# --- XLA's autotune level against the pair's train step ---------------------------------------------------------

def train_step_probe(tiny: bool, steps: int) -> dict:
  """configs/ende.py:target_v2's train programs (two buckets; tiny shapes with --tiny): compile seconds each,
  then ms per step on random batches of each shape."""
  sys.path.insert(0, os.path.join(os.path.dirname(jaxspec.__file__), "..", "configs"))
  from jaxspec.training import loop as train_loop
  import ende as ende_config  # configs/ende.py (needs ml_collections)
  c = ende_config.get_config("target_v2")
  if tiny:
    c.model.update(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)
    c.tokens_per_batch, c.max_len, c.length_buckets = 256, 32, "16"
  if jax.default_backend() == "cpu":
    c.compute_dtype = "float32"
  programs = train_loop.prepare_programs(c, 8000)
  programs.wait()
  params = t5.init_params(programs.settings.model, jax.random.key(0))
  opt_state = programs.optimizer.init(params)
  rng, out = np.random.RandomState(0), {"compile_s": dict(programs.seconds)}
  for rows, length in programs.planned:
    batch = rng.randint(3, 8000, size=(rows, length)).astype(np.int32)
    params, opt_state, m = programs.step(params, opt_state, batch, batch, None, 0, 1.0)
    jax.block_until_ready(m)
    t = time.perf_counter()
    for i in range(steps):
      params, opt_state, m = programs.step(params, opt_state, batch, batch, None, i + 1, 1.0)
    jax.block_until_ready(m)
    out[f"step_ms[{rows}x{length}]"] = (time.perf_counter() - t) / steps * 1e3
  return out


def autotune_levels(tiny: bool, steps: int, timeout: float, levels=(4, 0)) -> dict:
  """`train_step_probe` with --xla_gpu_autotune_level=N for each level (4 is XLA's default), a process each."""
  args = ["train_probe"] + (["--tiny"] if tiny else []) + [f"--steps={steps}"]
  return {f"level_{n}": _subprocess(args, f"--xla_gpu_autotune_level={n}", timeout) for n in levels}


# --- The run: stages under one budget, round3.json and round3.md ---------------------------------------------------

MIN_S = {"oracle": 120, "slots": 150, "kernels": 60, "autotune": 90, "pair": 240}  # skipped with less than this left


@dataclasses.dataclass(frozen=True)
class Round3Settings:
  """What one run takes (launch/gpu_round3.py's flags, one field each, of the same name): `out` ('' =
  runs/round3), `tiny` shapes, the `stages` (some of MIN_S, in this order) and `budget_s` for all of them; the
  oracle's `max_new_tokens`, `prompt_len`, `repeats` (timed runs per measurement, median) and `oracle_cases`
  (ende: t5-11b, llama: the 8B shape); the kernels' `kernel_variants` (KERNEL_VARIANTS' names); the autotune
  stage's `train_steps` (timed per program) and `autotune_levels`; the slots stage's `slot_levels` (row buckets,
  the largest = slots)."""

  out: str = ""
  tiny: bool = False
  stages: tuple[str, ...] = ("oracle", "slots", "kernels", "autotune")
  budget_s: float = 570
  max_new_tokens: int = 128
  prompt_len: int = 32
  repeats: int = 3
  train_steps: int = 20
  oracle_cases: tuple[str, ...] = ("ende", "llama")
  kernel_variants: tuple[str, ...] = tuple(KERNEL_VARIANTS)
  autotune_levels: tuple[int | str, ...] = (4, 0)
  slot_levels: tuple[int | str, ...] = (1, 4, 16, 64)


def environment() -> dict:
  """The machine, the versions, the command (sys.argv), XLA_FLAGS, the GPU (nvidia-smi) and the git commit."""
  env = {"command": " ".join([sys.executable] + sys.argv), "backend": jax.default_backend(),
         "devices": [str(d) for d in jax.devices()], "jax": jax.__version__, "python": platform.python_version(),
         "platform": platform.platform(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
         "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
  try:
    env["jaxlib"] = __import__("jaxlib").__version__
    env["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
  except Exception:  # No nvidia-smi on the CPU.
    env["gpu"] = None
  try:
    env["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
  except Exception:
    env["commit"] = None
  return env


def markdown(results: dict) -> str:
  """round3.md: the oracle rows as a table, the other stages' results and the errors as they are."""
  env = results["environment"]
  lines = [f"# Issue 32 round three on {env.get('gpu') or env['backend']}", "",
           f"JAX {env['jax']}, {env['backend']}, {'tiny shapes' if results['tiny'] else 'real shapes, random weights'}"
           f", commit {env.get('commit')}; command `{env['command']}`.", ""]
  if "oracle" in results:
    lines += ["## Oracle loop (batch 1, greedy, random weights)", "",
              "| case | design tok/iter | measured tok/iter | measured alpha | ms/token | speedup | identical | "
              "programs | paper |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results["oracle"].get("rows", []):
      if r["case"] == "plain":
        lines.append(f"| plain ({r['target']}) | | | | {r['ms_per_token']:.3f} | 1.00x | | {r['programs']} | |")
        continue
      m, d = r["measured"], r["design"]
      lines.append(f"| {r['case']} | {d['tokens_per_iteration']:.2f} | {m['tokens_per_iteration']:.2f} | "
                   f"{m['alpha']:.3f} ± {m['alpha_stderr']:.3f} | {r['ms_per_token']:.3f} | {r['speedup']:.2f}x | "
                   f"{r['identical_to_plain']} | {r['programs']} | {json.dumps(r['paper'])} |")
    lines.append("")
  if "slots" in results:
    sl = results["slots"]
    lines += [f"## The slot engine's step on the 8B shape (EAGLE-3 head, chain at alpha {sl['alpha']:.3f}: "
              f"tau {sl['tau']} at gamma {sl['gamma']}; {sl['iterations_per_step']} iterations a step)", "",
              "| rows | " + " | ".join(f"k={k} ms / tok/s" for k in sl["tiers"]) + " | budget's k | budget / plain |",
              "|---|" + "---|" * (len(sl["tiers"]) + 2)]
    for r in sl["levels"]:
      cells = " | ".join(f"{r['step_ms'][k]:.1f} / {r['tokens_per_s'][k]:.0f}" for k in sl["tiers"])
      lines.append(f"| {r['rows']} | {cells} | {r['budget_k']} | {r['budget_over_plain']:.2f}x |")
    lines.append("")
  for stage, title in (("kernels", "Draft step kernels"), ("autotune", "XLA autotune level and the train step"),
                       ("pair", "Pair training")):
    if stage in results:
      lines += [f"## {title}", "", "```json", json.dumps(results[stage], indent=1), "```", ""]
  if results.get("errors"):
    lines += ["## Errors", "", "```", *results["errors"], "```", ""]
  return "\n".join(lines)


def _oracle(s: Round3Settings, results: dict, counter: CompileCounter, save) -> None:
  results["oracle"] = {"rows": []}
  builds = {"ende": lambda: ende_cases(s.tiny, s.max_new_tokens), "llama": lambda: llama_cases(s.tiny)}
  for name in s.oracle_cases:
    target, cases = builds[name]()
    results["oracle"]["rows"] += run_cases(target, cases, prompt_len=s.prompt_len, max_new_tokens=s.max_new_tokens,
                                           repeats=s.repeats, counter=counter)
    del target, cases
    save()
  results["oracle"]["compiled"] = counter.stages


def _pair(out: str, left) -> dict:
  env = dict(os.environ, OUT=os.path.join(out, "pair"))
  deadline = int(left() - 20)
  res = subprocess.run(["bash", "launch/train_pair_gpu.sh", f"--deadline_s={deadline}"], env=env,
                       capture_output=True, text=True, timeout=left())
  summary = os.path.join(out, "pair", "summary.json")
  return {"returncode": res.returncode, "deadline_s": deadline, "tail": res.stdout[-2000:] + res.stderr[-2000:],
          "summary": json.load(open(summary)) if os.path.exists(summary) else None}


def run(s: Round3Settings) -> dict:
  """The stages in order under `budget_s` (docstring above); returns the results (also OUT/round3.json).
  ConfigError for a stage not in MIN_S, before anything runs."""
  unknown = [stage for stage in s.stages if stage not in MIN_S]
  if unknown:
    raise ConfigError(f"--stages: unknown stage {unknown[0]!r} (expected some of {', '.join(MIN_S)}).")
  t0, out, tiny = time.time(), s.out or "runs/round3", s.tiny
  os.makedirs(out, exist_ok=True)
  left = lambda: s.budget_s - (time.time() - t0)
  results = {"environment": environment(), "tiny": tiny, "stages_s": {}, "skipped": [], "errors": []}

  def save():
    atomic_write_json(os.path.join(out, "round3.json"), results, indent=1)
    with open(os.path.join(out, "round3.md"), "w", encoding="utf-8") as f:
      f.write(markdown(results))

  save()
  counter = CompileCounter()
  for stage in s.stages:
    if left() < (5 if tiny else MIN_S[stage]):
      results["skipped"].append(f"{stage}: {left():.0f} s left")
      save()
      continue
    t = time.time()
    try:
      if stage == "oracle":
        _oracle(s, results, counter, save)
      elif stage == "slots":
        with counter.stage("slots"):
          results["slots"] = slot_steps(tiny, levels=tuple(int(v) for v in s.slot_levels), repeats=s.repeats)
        results["slots"].update(counter.stages["slots"])
      elif stage == "kernels":
        results["kernels"] = kernel_variants(tiny, s.repeats, timeout=max(min(left() / 4, 150), 30),
                                             variants=list(s.kernel_variants))
      elif stage == "autotune":
        results["autotune"] = autotune_levels(tiny, s.train_steps, timeout=max(min(left() / 2, 200), 30),
                                              levels=[int(v) for v in s.autotune_levels])
      elif stage == "pair":
        results["pair"] = _pair(out, left)
    except Exception:  # Record and go on to the next stage: a call's minutes are few.
      results["errors"].append(f"{stage}: {traceback.format_exc()[-3000:]}")
    results["stages_s"][stage] = round(time.time() - t, 1)
    save()
  results["total_s"] = round(time.time() - t0, 1)
  save()
  print(f"wrote {out}/round3.json and round3.md in {results['total_s']} s", flush=True)
  return results


def _main(argv: list[str]) -> None:
  """Subprocess entry: `python -m jaxspec.bench.round3 probe|train_probe [--tiny] [--repeats=N] [--steps=N]`,
  one JSON line on stdout."""
  tiny = "--tiny" in argv
  value = lambda k, d: int(next((a.split("=")[1] for a in argv if a.startswith(f"--{k}=")), d))
  if argv[0] == "probe":
    result = draft_step_probe(tiny, value("repeats", 5))
  elif argv[0] == "train_probe":
    result = train_step_probe(tiny, value("steps", 10))
  else:
    raise SystemExit(f"unknown probe {argv[0]!r}")
  print(json.dumps({"backend": jax.default_backend(), **result}), flush=True)


if __name__ == "__main__":
  _main(sys.argv[1:])
