r"""Chains against token trees on one pair, side by side (issue 22; jaxspec.bench.trees).

    python launch/tree_benchmark.py                      # embedded EN-DE pair, dev sentences, writes runs/trees/
    python launch/tree_benchmark.py --gamma=4 --trees=2,6:4,12 --temperatures=0,1 --batch_sizes=1,4 --sentences=8
    OMP_WAIT_POLICY=PASSIVE python launch/tree_benchmark.py --target=/models/qwen2.5-coder-1.5b-instruct \
        --draft=/models/qwen2.5-coder-0.5b-instruct --input=docs/bench/qwen_prompts.jsonl --sentences=4 \
        --trees=2,6:4,12 --lookup=false --probe_repeats=1 --probe_calls=4 --output_name=trees_qwen   # decoder-only

For each (temperature, batch size): plain decoding, the chain of depth --gamma (draft model and prompt lookup) and
each --trees shape of the same depth, with tau, acceptance per depth, r(N), ms/token and speedup, and each
variant's warm-up pass and compilation apart from the timed passes; with --peer, transformers' assisted generation
on the same weights in the same run (after jaxspec's arrays are freed; greedy output compared with jaxspec's plain
decoding). Inputs as launch/benchmark.py reads them (`jaxspec.bench.inputs`: a .jsonl file of chats is rendered by
the target's chat template). Writes <output_name>.json and <output_name>.md to --output_dir.
"""

import gc
import json
import os
import platform
import shlex
import sys
import time

import jax
from absl import flags

import jaxspec
from jaxspec.bench import inputs, peer, trees
from jaxspec.cli import flags as cli_flags, resume
from jaxspec.data.ende import split_path

cli_flags.define_models()
_INPUT = flags.DEFINE_string("input", "dev", "A text file, an EN-DE TSV ('en' column), a .jsonl of chats "
                             "({'messages': [...]}, rendered by the target's chat template), or 'dev' / 'test'.")
_PREFIX = flags.DEFINE_string("prefix", "", "Text put before each input (T5's task prefix).")
_CHAT = flags.DEFINE_boolean("chat", False, "Apply the target tokenizer's chat template to every text input.")
_SENTENCES = flags.DEFINE_integer("sentences", 16, "Inputs used (the first N).", lower_bound=1)
_GAMMA = flags.DEFINE_integer("gamma", 4, "Depth of every chain and tree.", lower_bound=1)
_TREES = flags.DEFINE_string("trees", "2,6:3,10:4,16", "Tree shapes 'K,N' (top_k, nodes), separated by ':'.")
_LOOKUP = flags.DEFINE_boolean("lookup", True, "Also prompt lookup (NGramDraft), as a chain and as a K=3 tree.")
cli_flags.define_number_list("temperatures", [0.0, 1.0], "Temperatures.", kind=float)
cli_flags.define_number_list("batch_sizes", [1, 4], "Batch sizes.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed passes per point (the median is reported).", lower_bound=1)
_PROBE_REPEATS = flags.DEFINE_integer("probe_repeats", 5, "Timed blocks per r(N) probe (the median); 1 for "
                                      "models whose step takes hundreds of ms.", lower_bound=1)
_PROBE_CALLS = flags.DEFINE_integer("probe_calls", 8, "Calls per timed block of an r(N) probe.", lower_bound=1)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Tokens generated per input at most.", lower_bound=1)
_PEER = flags.DEFINE_boolean("peer", True, "Also transformers' assisted generation (batch 1, temperature 0).")
_OUT = flags.DEFINE_string("output_dir", "runs/trees", "Where <output_name>.json and <output_name>.md go (checked "
                           "before anything loads; the committed results in docs/bench are written only when named).")
_NAME = flags.DEFINE_string("output_name", "trees", "Base name of the files written (trees.json, trees.md).")
flags.register_validator("output_name", lambda v: bool(v) and os.sep not in v,
                         message="--output_name must be a file name without a directory.")
FLAGS = flags.FLAGS


def _variants(draft: jaxspec.Model) -> list[jaxspec.Speculation]:
  """The draft model's chain and --trees, and prompt lookup's chain and K=3 tree with --lookup, all of depth --gamma."""
  g = _GAMMA.value
  variants = [jaxspec.Speculation(draft, gamma=g)]
  variants += [jaxspec.Speculation(draft, gamma=g, tree=t) for t in cli_flags.parse_trees(_TREES.value)]
  if _LOOKUP.value:
    lookup = jaxspec.NGramDraft()
    variants += [jaxspec.Speculation(lookup, gamma=g),
                 jaxspec.Speculation(lookup, gamma=g, tree=jaxspec.Tree(3, 3 * g))]
  return variants


def _rss_gib() -> float | None:
  """This process's resident memory in GiB (Linux), or None."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
  except (OSError, ValueError, IndexError):
    return None


def main(argv):
  del argv
  resume.check_output_dir(_OUT.value)  # Before loading and timing: not a lost run at the end.
  for shape in cli_flags.parse_trees(_TREES.value):  # a shape --gamma does not suit: one line, before loading
    try:
      shape.check_depth(_GAMMA.value)
    except ValueError as e:
      raise type(e)(f"--trees={_TREES.value} with --gamma={_GAMMA.value}: {e}") from None
  start = time.perf_counter()
  stages = {}
  target, draft = jaxspec.load(FLAGS.target), jaxspec.load(FLAGS.draft)
  spec = _INPUT.value if _INPUT.value not in ("train", "dev", "test") else split_path(_INPUT.value, "")
  ids = inputs.prompt_ids(target, spec, _SENTENCES.value, prefix=_PREFIX.value, chat=_CHAT.value)
  if not ids or not all(ids):
    raise SystemExit(f"--input {spec}: no non-empty inputs.")
  variants = _variants(draft)
  meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "jax": jax.__version__,
          "backend": jax.default_backend(), "target": repr(target), "draft": repr(draft), "sentences": len(ids),
          "prompt_tokens": [len(i) for i in ids], "max_new_tokens": _MAX_NEW.value, "repeats": _REPEATS.value,
          "probe_repeats": _PROBE_REPEATS.value, "probe_calls": _PROBE_CALLS.value,
          "command": shlex.join(["python"] + sys.argv), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
          "load_average_before": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M")}
  stages["load"] = time.perf_counter() - start
  rows = trees.compare(target, variants, ids, FLAGS.temperatures, FLAGS.batch_sizes, _REPEATS.value, _MAX_NEW.value,
                       cost_repeats=_PROBE_REPEATS.value, cost_calls=_PROBE_CALLS.value, keep_tokens=_PEER.value)
  stages["jaxspec"] = time.perf_counter() - start - sum(stages.values())
  peer_rows = []
  if _PEER.value:
    greedy = next((r["token_ids"] for r in rows if "token_ids" in r and r["batch"] == 1), None)
    sources = peer.hf_source(target), peer.hf_source(draft)
    meta["rss_gib_jaxspec"] = _rss_gib()
    del target, draft, variants  # transformers loads its own copy: free ours when it was read from an HF directory
    gc.collect()
    meta["rss_gib_before_transformers"] = _rss_gib()
    meta["jax_live_gib_before_transformers"] = sum(a.nbytes for a in jax.live_arrays()) / 2**30
    try:
      peer_rows = peer.run_peer(*sources, ids, [_GAMMA.value], _REPEATS.value, _MAX_NEW.value, reference=greedy)
    except Exception as e:  # pylint: disable=broad-except
      # The peer is a comparison, not the product: report its failure and keep jaxspec's results.
      print(f"transformers peer failed: {type(e).__name__}: {e}", flush=True)
      peer_rows = [{"error": f"{type(e).__name__}: {e}"}]
    stages["transformers"] = time.perf_counter() - start - sum(stages.values())
  meta["load_average_after"] = os.getloadavg()[0]
  meta["stages_s"] = stages
  os.makedirs(_OUT.value, exist_ok=True)
  paths = [os.path.join(_OUT.value, f"{_NAME.value}.{ext}") for ext in ("json", "md")]
  with open(paths[0], "w") as f:
    json.dump({"meta": meta, "rows": rows, "peer": peer_rows}, f, indent=1)
  table = trees.markdown(rows, peer_rows, meta)
  with open(paths[1], "w") as f:
    f.write(table)
  print(table)
  print("written: " + ", ".join(paths))


if __name__ == "__main__":
  cli_flags.run(main)
