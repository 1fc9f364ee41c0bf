r"""Chains against token trees on one pair, side by side (issue 22; jaxspec.bench.trees).

    python launch/tree_benchmark.py                      # embedded EN-DE pair, dev sentences, writes docs/bench/
    python launch/tree_benchmark.py --gamma=4 --trees=2,6:4,12 --temperatures=0,1 --batch_sizes=1,4 --sentences=8

For each (temperature, batch size): plain decoding, the chain of depth --gamma (draft model and prompt lookup) and
each --trees shape of the same depth, with tau, acceptance per depth, r(N), ms/token and speedup; with --peer,
transformers' assisted generation on the same weights in the same run. Writes trees.json and trees.md.
"""

import json
import os
import platform
import shlex
import sys
import time

import jax
from absl import flags

import jaxspec
from jaxspec.bench import peer, trees
from jaxspec.cli import flags as cli_flags
from jaxspec.cli.batching import MAX_INPUT_LENGTH
from jaxspec.cli.inputs import encode_texts, read_corpus_texts
from jaxspec.data.ende import split_path

cli_flags.define_models()
_INPUT = flags.DEFINE_string("input", "dev", "A text file, an EN-DE TSV ('en' column), or 'dev' / 'test'.")
_PREFIX = flags.DEFINE_string("prefix", "", "Text put before each input (T5's task prefix).")
_SENTENCES = flags.DEFINE_integer("sentences", 16, "Inputs used (the first N).", lower_bound=1)
_GAMMA = flags.DEFINE_integer("gamma", 4, "Depth of every chain and tree.", lower_bound=1)
_TREES = flags.DEFINE_string("trees", "2,6:3,10:4,16", "Tree shapes 'K,N' (top_k, nodes), separated by ':'.")
_LOOKUP = flags.DEFINE_boolean("lookup", True, "Also prompt lookup (NGramDraft), as a chain and as a K=3 tree.")
cli_flags.define_number_list("temperatures", [0.0, 1.0], "Temperatures.", kind=float)
cli_flags.define_number_list("batch_sizes", [1, 4], "Batch sizes.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed passes per point (the median is reported).", lower_bound=1)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Tokens generated per input at most.", lower_bound=1)
_PEER = flags.DEFINE_boolean("peer", True, "Also transformers' assisted generation (batch 1, temperature 0).")
_OUT = flags.DEFINE_string("output_dir", "docs/bench", "Where trees.json and trees.md go.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  target, draft = jaxspec.load(FLAGS.target), jaxspec.load(FLAGS.draft)
  spec = _INPUT.value if _INPUT.value not in ("train", "dev", "test") else split_path(_INPUT.value, "")
  texts = read_corpus_texts(spec, True)[:_SENTENCES.value]
  ids = encode_texts(target.tokenizer, texts, prefix=_PREFIX.value, max_input_length=MAX_INPUT_LENGTH)
  shapes = cli_flags.parse_trees(_TREES.value)
  g = _GAMMA.value
  variants = [jaxspec.Speculation(draft, gamma=g)] + [jaxspec.Speculation(draft, gamma=g, tree=t) for t in shapes]
  if _LOOKUP.value:
    lookup = jaxspec.NGramDraft()
    variants += [jaxspec.Speculation(lookup, gamma=g),
                 jaxspec.Speculation(lookup, gamma=g, tree=jaxspec.Tree(3, 3 * g))]
  meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "jax": jax.__version__,
          "backend": jax.default_backend(), "target": repr(target), "draft": repr(draft), "sentences": len(ids),
          "max_new_tokens": _MAX_NEW.value, "repeats": _REPEATS.value, "command": shlex.join(["python"] + sys.argv),
          "load_average_before": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M")}
  rows = trees.compare(target, variants, ids, FLAGS.temperatures, FLAGS.batch_sizes, _REPEATS.value, _MAX_NEW.value)
  peer_rows = []
  if _PEER.value:
    try:
      peer_rows = peer.run_peer(peer.hf_source(target), peer.hf_source(draft), ids, [g], _REPEATS.value,
                                _MAX_NEW.value)
    except Exception as e:  # pylint: disable=broad-except
      peer_rows = [{"error": f"{type(e).__name__}: {e}"}]
  meta["load_average_after"] = os.getloadavg()[0]
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "trees.json"), "w") as f:
    json.dump({"meta": meta, "rows": rows, "peer": peer_rows}, f, indent=1)
  table = trees.markdown(rows, peer_rows, meta)
  with open(os.path.join(_OUT.value, "trees.md"), "w") as f:
    f.write(table)
  print(table)


if __name__ == "__main__":
  cli_flags.run(main)
