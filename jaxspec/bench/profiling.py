"""Where the decoding loop's time goes, from a profiler trace: the models' kernels vs everything else.

The loop labels its model calls with `jax.named_scope("target_step")` and `("draft_step")`, so every kernel of
the compiled `run` program carries one of those names in its HLO metadata, or neither (the loop's own work:
verification, argmax and sampling, writes, counters). `loop_time_breakdown` decodes under `jax.profiler`, maps
each kernel event of the trace to its HLO instruction, and splits each execution's wall time into:

  target: time when a target kernel runs;  draft: a draft kernel (and no target kernel);
  loop: one of the loop's own kernels only;  idle: no kernel at all (dispatch, control flow, synchronisation).

Kernels may run concurrently on the runtime's threads, so these are unions of intervals, not sums of durations:
the four parts add up to the wall time. (target + draft) / wall is the share the models themselves take.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import tempfile
from collections import defaultdict
from typing import Callable, Iterable

import jax

CATEGORIES = ("target", "draft", "loop", "idle")


def instruction_categories(hlo_text: str) -> dict[str, str]:
  """{instruction name: 'target' | 'draft' | 'loop' | 'control'} from a compiled program's HLO text.

  An instruction belongs to the model whose named scope its op_name metadata carries; a fusion, to the model
  whose work it fuses (its root may be the loop's, e.g. a softmax's max fused with the output layer's dot).
  Some passes drop the metadata (the CPU backend's rewritten dots, for one); those take the category of their
  operands (a dot fed by a target activation is the target's), and are the loop's when no operand says
  otherwise.
  """
  own, operands, calls = {}, {}, {}
  inside: dict[str, set] = defaultdict(set)  # computation -> the models named inside it
  computation = ""
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$", line)
    if head:
      computation = head.group(1)
      continue
    m = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$", line)
    if not m:
      continue
    name, rest = m.groups()
    op_name = re.search(r'op_name="([^"]*)"', rest)
    op_name = op_name.group(1) if op_name else ""
    called = re.search(r"calls=%([\w.\-]+)", rest)
    if called:
      calls[name] = called.group(1)
    for model in ("target", "draft"):
      if f"{model}_step" in op_name:
        inside[computation].add(model)
    if re.search(r"\b(while|conditional|call)\(", rest):
      own[name] = "control"  # Its events span its bodies' kernels, which are counted themselves.
    elif "target_step" in op_name:
      own[name] = "target"
    elif "draft_step" in op_name:
      own[name] = "draft"
    else:
      own[name] = "loop" if op_name else None
    call = re.search(r"\b[a-z][\w\-]*\(([^()]*)\)", rest)  # opcode(%operand, ...) after the shape
    operands[name] = re.findall(r"%([\w.\-]+)", call.group(1)) if call else []
  # A fusion is named after its root, which may be the loop's (a softmax's max fused with the output layer's
  # dot): it is the model's when the fused computation holds that model's work.
  for name, computation in calls.items():
    if own.get(name) != "control" and inside.get(computation):
      own[name] = "target" if "target" in inside[computation] else "draft"

  resolved: dict[str, str] = {}

  def category(name: str, depth: int = 0) -> str:
    if name in resolved:
      return resolved[name]
    cat = own.get(name)
    if cat is None and depth < 50:
      found = [category(o, depth + 1) for o in operands.get(name, []) if o in own]
      cat = next((c for c in found if c in ("target", "draft")), "loop")
    resolved[name] = cat or "loop"
    return resolved[name]

  return {name: category(name) for name in own}


def _union_length(intervals: list[tuple[float, float]]) -> float:
  total, end = 0.0, float("-inf")
  for s, e in sorted(intervals):
    if e <= end:
      continue
    total += e - max(s, end)
    end = e
  return total


def _covered(intervals_by_cat: dict[str, list], order: Iterable[str]) -> dict[str, float]:
  """Union length per category, each counting only time not covered by the categories before it."""
  out, seen = {}, []
  for cat in order:
    seen = seen + intervals_by_cat.get(cat, [])
    out[cat] = _union_length(seen)
  prev = 0.0
  for cat in order:  # cumulative -> exclusive
    out[cat], prev = out[cat] - prev, out[cat]
  return out


def breakdown_from_trace(events: list[dict], categories: dict[str, str], module: str = "jit_run") -> dict:
  """Seconds per category summed over the executions of `module` in a Chrome-trace event list."""
  runs: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
  unmapped = set()
  for e in events:
    args = e.get("args") or {}
    if e.get("ph") != "X" or args.get("hlo_module") != module or "hlo_op" not in args:
      continue
    cat = categories.get(args["hlo_op"])
    if cat is None:
      unmapped.add(args["hlo_op"])
      continue
    start = float(e["ts"]) * 1e-6
    runs[args.get("run_id", "")][cat].append((start, start + float(e.get("dur", 0)) * 1e-6))
  totals = dict.fromkeys(CATEGORIES + ("wall",), 0.0)
  for by_cat in runs.values():
    spans = [iv for cat_ivs in by_cat.values() for iv in cat_ivs]
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    kernels = {c: by_cat.get(c, []) for c in ("target", "draft", "loop")}
    parts = _covered(kernels, ("target", "draft", "loop"))
    for c, v in parts.items():
      totals[c] += v
    totals["idle"] += wall - sum(parts.values())
    totals["wall"] += wall
  totals["executions"] = len(runs)
  totals["unmapped_instructions"] = sorted(unmapped)
  return totals


def loop_time_breakdown(decode: Callable[[], object], hlo_text: str, module: str = "jit_run") -> dict:
  """Runs decode() (already compiled: warm it up first) under the profiler and splits the loop's wall time.

  Args:
    decode: runs the decodes to profile and blocks until they finish.
    hlo_text: the compiled HLO of the loop program those decodes execute (`jit(...).lower(...).compile()
      .as_text()` with the same shapes), to map kernels to the target, the draft or the loop.
  Returns:
    {'target', 'draft', 'loop', 'idle', 'wall': seconds summed over executions, 'executions': count,
     'unmapped_instructions': kernels not found in hlo_text (should be empty)}.
  """
  categories = instruction_categories(hlo_text)
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp, create_perfetto_trace=True)
    try:
      decode()
    finally:
      jax.profiler.stop_trace()
    paths = glob.glob(os.path.join(tmp, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
      raise RuntimeError(f"The profiler wrote no trace file under {tmp}.")
    with gzip.open(paths[0], "rt") as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return breakdown_from_trace(events, categories, module)
