r"""Issue 32 on a lent GPU in one prepared call: the oracle loop, the draft step's kernels, XLA's autotune level,
then the pair's training with what is left (docs/accelerator.md has how to run it and what each part answers).

    python launch/gpu_round3.py --out=$OUT                     # oracle, kernels, autotune (~4-5 min on an H100)
    python launch/gpu_round3.py --out=$OUT --stages=pair       # the pair alone (launch/train_pair_gpu.sh)
    python launch/gpu_round3.py --out=/tmp/r3 --tiny           # tiny shapes: the CPU test of this script

Stages, in order of value (--stages picks; each is skipped when less than its minimum is left of --budget_s):
  oracle    the paper's EnDe small row (t5-11b target, t5-small draft, gamma 7, alpha 0.75: chain, tree, T5 head
            copied and slim) and a Llama-3.1-8B-shaped target with an EAGLE-3 head at 6.1 tokens per iteration
            (tree and chain): ms per token against plain greedy decoding, measured acceptance against the design;
  kernels   the t5-small step's kernels and ms, and the 8B head's ms, with XLA's command buffers as they are, off,
            and on for every kind (a process each: XLA reads its flags once);
  autotune  the v2 target's two train programs compiled at --xla_gpu_autotune_level 4 (default) and 0: compile
            seconds and ms per step (does level 0 shorten compiles without slowing steps?);
  pair      bash launch/train_pair_gpu.sh --deadline_s=<what is left> (needs runs/corpus and runs/wheels carried).
Writes $OUT/round3.json (machine, versions, command, every result, compiled programs per stage) and
$OUT/round3.md (the tables), both rewritten after every stage, and the pair's files under $OUT/pair/.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import traceback

import jax
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxspec.bench import round3  # noqa: E402
from jaxspec.tools.outputs import atomic_write_json  # noqa: E402

_OUT = flags.DEFINE_string("out", os.environ.get("OUT", ""), "Output directory.")
_TINY = flags.DEFINE_boolean("tiny", False, "Tiny shapes of the same families (the CPU test).")
_STAGES = flags.DEFINE_list("stages", ["oracle", "kernels", "autotune"], "Stages to run, in this order.")
_BUDGET = flags.DEFINE_float("budget_s", 570, "Seconds for everything (a device call is cut at 600).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per oracle run (the paper's EnDe: 128).")
_PROMPT = flags.DEFINE_integer("prompt_len", 32, "Prompt tokens of the oracle runs.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per measurement (median).")
_STEPS = flags.DEFINE_integer("train_steps", 20, "Timed train steps per program in the autotune stage.")
_CASES = flags.DEFINE_list("oracle_cases", ["ende", "llama"], "Oracle targets: ende (t5-11b), llama (8B shape).")
_VARIANTS = flags.DEFINE_list("kernel_variants", list(round3.KERNEL_VARIANTS), "XLA flag variants (kernels).")
_LEVELS = flags.DEFINE_list("autotune_levels", ["4", "0"], "--xla_gpu_autotune_level values (autotune).")

MIN_S = {"oracle": 120, "kernels": 60, "autotune": 90, "pair": 240}  # skipped with less than this left


def _environment() -> dict:
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
    env["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
  except Exception:
    env["commit"] = None
  return env


def _markdown(results: dict) -> str:
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
  if "kernels" in results:
    lines += ["## Draft step kernels", "", "```json", json.dumps(results["kernels"], indent=1), "```", ""]
  if "autotune" in results:
    lines += ["## XLA autotune level and the train step", "", "```json", json.dumps(results["autotune"], indent=1),
              "```", ""]
  if "pair" in results:
    lines += ["## Pair training", "", "```json", json.dumps(results["pair"], indent=1), "```", ""]
  if results.get("errors"):
    lines += ["## Errors", "", "```", *results["errors"], "```", ""]
  return "\n".join(lines)


def main(argv):
  del argv
  t0, out, tiny = time.time(), _OUT.value or "runs/round3", _TINY.value
  os.makedirs(out, exist_ok=True)
  left = lambda: _BUDGET.value - (time.time() - t0)
  results = {"environment": _environment(), "tiny": tiny, "stages_s": {}, "skipped": [], "errors": []}

  def save():
    atomic_write_json(os.path.join(out, "round3.json"), results, indent=1)
    with open(os.path.join(out, "round3.md"), "w", encoding="utf-8") as f:
      f.write(_markdown(results))

  save()
  counter = round3.CompileCounter()
  for stage in _STAGES.value:
    if stage not in MIN_S:
      raise app.UsageError(f"--stages: unknown stage {stage!r} (expected some of {', '.join(MIN_S)}).")
    if left() < (5 if tiny else MIN_S[stage]):
      results["skipped"].append(f"{stage}: {left():.0f} s left")
      save()
      continue
    t = time.time()
    try:
      if stage == "oracle":
        results["oracle"] = {"rows": []}
        builds = {"ende": lambda: round3.ende_cases(tiny, _MAX_NEW.value), "llama": lambda: round3.llama_cases(tiny)}
        for name in _CASES.value:
          target, cases = builds[name]()
          results["oracle"]["rows"] += round3.run_cases(target, cases, prompt_len=_PROMPT.value,
                                                        max_new_tokens=_MAX_NEW.value, repeats=_REPEATS.value,
                                                        counter=counter)
          del target, cases
          save()
        results["oracle"]["compiled"] = counter.stages
      elif stage == "kernels":
        results["kernels"] = round3.kernel_variants(tiny, _REPEATS.value, timeout=max(min(left() / 4, 150), 30),
                                                    variants=_VARIANTS.value)
      elif stage == "autotune":
        results["autotune"] = round3.autotune_levels(tiny, _STEPS.value, timeout=max(min(left() / 2, 200), 30),
                                                     levels=[int(v) for v in _LEVELS.value])
      elif stage == "pair":
        env = dict(os.environ, OUT=os.path.join(out, "pair"))
        deadline = int(left() - 20)
        res = subprocess.run(["bash", "launch/train_pair_gpu.sh", f"--deadline_s={deadline}"], env=env,
                             capture_output=True, text=True, timeout=left())
        summary = os.path.join(out, "pair", "summary.json")
        results["pair"] = {"returncode": res.returncode, "deadline_s": deadline, "tail": res.stdout[-2000:]
                           + res.stderr[-2000:], "summary": json.load(open(summary)) if os.path.exists(summary) else None}
    except Exception:  # Record and go on to the next stage: a call's minutes are few.
      results["errors"].append(f"{stage}: {traceback.format_exc()[-3000:]}")
    results["stages_s"][stage] = round(time.time() - t, 1)
    save()
  results["total_s"] = round(time.time() - t0, 1)
  save()
  print(f"wrote {out}/round3.json and round3.md in {results['total_s']} s", flush=True)


if __name__ == "__main__":
  app.run(main)
