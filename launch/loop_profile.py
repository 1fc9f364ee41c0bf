r"""What the decoding loop adds beyond the models: its wall time split by a profiler trace.

    python launch/loop_profile.py                                  # embedded pair, plain and gamma 1-4, 6, 8
    python launch/loop_profile.py --gammas=0,3 --sentences=8 --output=runs/profile

For plain decoding (gamma 0) and each gamma, decodes the same inputs (batch 1 by default) under `jax.profiler`
and splits the loop program's wall time per iteration into the target's kernels, the draft's, the loop's own and
idle time; from the same traces c, r and the loop's speedup next to Theorem 3.8 (`jaxspec.bench.loop`). Inputs
are those of the most common prompt-length bucket. Writes OUTPUT.json and OUTPUT.md and prints where they are.
"""

import os
import platform
import time

import jax
from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags
from jaxspec.bench import loop
from jaxspec.data.ende import split_path
from jaxspec.tools.inputs import read_corpus_texts
from jaxspec.tools.outputs import atomic_write, atomic_write_json

cli_flags.define_models()
_INPUT = flags.DEFINE_string("input", "dev", "EN-DE TSV ('en' column; natural sentences first), text file, or "
                             "'dev' / 'test' of --data_dir.")
_DATA = flags.DEFINE_string("data_dir", "", "EN-DE corpus directory ('' = jaxspec.data.ende.default_data_dir()).")
_SENTENCES = flags.DEFINE_integer("sentences", 16, "Inputs profiled.", lower_bound=1)
cli_flags.define_number_list("gammas", [0, 1, 2, 3, 4, 6, 8], "Gammas; 0 is plain decoding.")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Rows decoded together.", lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0 = greedy).", lower_bound=0.0)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens generated per input at most.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Profiles per configuration, interleaved across configurations.",
                               lower_bound=1)
_OUT = flags.DEFINE_string("output", "docs/bench/loop_profile", "Writes OUTPUT.json and OUTPUT.md.")


def main(argv):
  del argv
  spec = _INPUT.value if _INPUT.value not in ("train", "dev", "test") else split_path(_INPUT.value, _DATA.value)
  texts = read_corpus_texts(spec, natural_only=True)
  target, draft = jaxspec.load(flags.FLAGS.target), jaxspec.load(flags.FLAGS.draft)
  bucket, ids = loop.common_bucket([target.tokenizer.encode(t) for t in texts], _SENTENCES.value)
  batches = [ids[k:k + _BATCH.value] for k in range(0, len(ids) - _BATCH.value + 1, _BATCH.value)]
  if not batches:
    raise SystemExit(f"{len(ids)} inputs in prompt bucket {bucket}: fewer than --batch_size={_BATCH.value}.")
  rows = loop.profile_sweep(target, draft, batches, flags.FLAGS.gammas, _ROUNDS.value,
                            jaxspec.Sampling(temperature=_TEMPERATURE.value), max_new_tokens=_MAX_NEW.value)
  meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "jax": jax.__version__,
          "backend": jax.default_backend(), "target": repr(target), "draft": repr(draft), "inputs": len(ids),
          "prompt_bucket": bucket, "rounds": _ROUNDS.value, "batch_size": _BATCH.value,
          "temperature": _TEMPERATURE.value, "date": time.strftime("%Y-%m-%d")}
  lines = [f"Machine: {meta['machine']}; JAX {meta['jax']} on {meta['backend']}; target {meta['target']}; draft "
           f"{meta['draft']}; {len(ids)} inputs (prompt bucket {bucket}), batch {_BATCH.value}, temperature "
           f"{_TEMPERATURE.value:g}; {_ROUNDS.value} profiles per configuration, interleaved.", ""] + loop.table(rows)
  atomic_write_json(_OUT.value + ".json", {"meta": meta, "rows": rows}, indent=2)
  atomic_write(_OUT.value + ".md", "\n".join(lines) + "\n")
  print("\n".join(lines))
  print(f"written: {_OUT.value}.json, {_OUT.value}.md")


if __name__ == "__main__":
  cli_flags.run(main)
