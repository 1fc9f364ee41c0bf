r"""Benchmarks plain vs speculative decoding the way the paper reports it, next to transformers.

    python launch/benchmark.py                                   # embedded pair, full sweep, writes runs/benchmark/
    python launch/benchmark.py --gammas=1,2,3 --temperatures=0 --batch_sizes=1 --sentences=8 --repeats=1
    python launch/benchmark.py --target=/ckpt/t5-11b --draft=/ckpt/t5-small \
        --input=newstest2014.en --prefix="translate English to German: " --gammas=7 --peer=false
    python launch/benchmark.py --paper=configs/paper_t5.py:ende_small_t0 --paper.checkpoint_dir=/mnt/disks/t5
    OMP_WAIT_POLICY=PASSIVE python launch/benchmark.py --target=/models/qwen2.5-coder-1.5b-instruct \
        --draft=/models/qwen2.5-coder-0.5b-instruct --input=docs/bench/qwen_prompts.jsonl --gammas=3,5 \
        --temperatures=0 --batch_sizes=1 --probe_repeats=1 --output_dir=/tmp/qwen   # a decoder-only pair

For every (temperature, batch size, gamma) and --schedules: alpha, tokens per iteration, acceptance per draft
position, ms per token of plain and speculative decoding (medians of interleaved passes after a warm-up pass),
latency percentiles, the speedup and Theorem 3.8's prediction three ways (`jaxspec.bench.sweep`). Decoder-only
pairs take prompts as text lines (--chat applies the tokenizer's chat template) or a .jsonl file of
{"messages": [...]} chats (always templated). With --peer, transformers' plain greedy and assisted generation on
the same weights (`jaxspec.bench.peer`, float32, batch 1; OMP_WAIT_POLICY=PASSIVE keeps torch's threads from
spinning), and greedy exactness: jaxspec's speculative == jaxspec's plain == transformers' greedy token ids.
Writes results.json, results.md (aligned markdown, the paper's Table 2 form) and speedup.png to --output_dir.
"""

import os
import platform
import shlex
import sys
import time

import jax
from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags, resume
from jaxspec.bench import inputs, peer, report, sweep, tune
from jaxspec.data.ende import split_path

cli_flags.define_models()
cli_flags.define_mesh()
_INPUT = flags.DEFINE_string("input", "dev", "A text file (one input a line), an EN-DE TSV ('en' column), a .jsonl "
                             "of chats ({'messages': [...]}), or 'dev' / 'test' of --data_dir. Empty lines skipped.")
_DATA = flags.DEFINE_string("data_dir", "", "EN-DE corpus directory ('' = jaxspec.data.ende.default_data_dir()).")
_TOKEN_IDS = flags.DEFINE_boolean("input_is_token_ids", False, "The input file holds space-separated token ids "
                                  "(for models without a tokenizer).")
_NATURAL = flags.DEFINE_boolean("natural_only", True, "From a corpus TSV, keep the natural sentences only.")
_PREFIX = flags.DEFINE_string("prefix", "", "Text put before each input (T5's task prefix).")
_CHAT = flags.DEFINE_boolean("chat", False, "Apply the target tokenizer's chat template to every text input.")
_SENTENCES = flags.DEFINE_integer("sentences", 32, "Inputs used (the first N).", lower_bound=1)
cli_flags.define_number_list("gammas", list(range(1, 9)), "Gammas to sweep.", lower_bound=1)
cli_flags.define_number_list("temperatures", [0.0, 1.0], "Temperatures to sweep.", kind=float)
cli_flags.define_number_list("batch_sizes", [1, 4, 16], "Batch sizes to sweep.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed passes per point (the median is reported).", lower_bound=1)
_PROBE_REPEATS = flags.DEFINE_integer("probe_repeats", 5, "Timed calls per isolated cost (c, r) in each round; 1 "
                                      "for models whose step takes hundreds of ms.", lower_bound=1)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens generated per input at most.", lower_bound=1)
_SCHEDULES = flags.DEFINE_list("schedules", ["constant"], "Schedules: constant (the paper's), adaptive, heuristic.")
_PEER = flags.DEFINE_boolean("peer", True, "Also run transformers' assisted generation on the same weights.")
_PAPER = cli_flags.define_config_file("paper", None, "A row of configs/paper_t5.py: sets the target, draft, input, "
                                      "prefix, gamma, temperature and batch size of the paper's setup.")
_OUT = flags.DEFINE_string("output_dir", "runs/benchmark", "Where results.json, results.md and speedup.png go "
                           "(checked before anything loads; the committed results in docs/bench are written only when "
                           "named).")
FLAGS = flags.FLAGS


def _apply_paper_row() -> None:
  p = _PAPER.value
  if p.checkpoint_dir is None:
    raise SystemExit("--paper needs --paper.checkpoint_dir: the directory holding t5-11b/, t5-small/, ...")
  FLAGS.target, FLAGS.draft = os.path.join(p.checkpoint_dir, p.target), os.path.join(p.checkpoint_dir, p.draft)
  FLAGS.input, FLAGS.prefix = p.input, p.prefix
  FLAGS.gammas, FLAGS.temperatures = [p.gamma], [p.temperature]
  FLAGS.batch_sizes, FLAGS.max_new_tokens = [p.batch_size], p.max_new_tokens


def _input_ids(target, spec: str) -> list[list[int]]:
  """Token ids of the first --sentences inputs of `spec` (`jaxspec.bench.inputs.prompt_ids`)."""
  return inputs.prompt_ids(target, spec, _SENTENCES.value, natural_only=_NATURAL.value, token_ids=_TOKEN_IDS.value,
                           prefix=_PREFIX.value, chat=_CHAT.value)


def _machine() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
  except OSError:
    cpu = ""
  return " ".join(x for x in (platform.machine(), cpu, f"{os.cpu_count()} cores") if x)


def main(argv):
  del argv
  resume.check_output_dir(_OUT.value)  # Before loading and timing: not a lost run at the end.
  mesh = cli_flags.mesh()
  if _PAPER.value is not None:
    _apply_paper_row()
  spec = _INPUT.value if _INPUT.value not in ("train", "dev", "test") else split_path(_INPUT.value, _DATA.value)
  target, draft = jaxspec.load(FLAGS.target, mesh=mesh), jaxspec.load(FLAGS.draft)
  if mesh is not None:
    draft = jaxspec.shard(draft, mesh, rules=jaxspec.DRAFT_RULES)
  ids = _input_ids(target, spec)
  if not ids or not all(ids):
    raise SystemExit(f"--input {spec}: no non-empty inputs.")
  meta = {"machine": _machine(), "jax": jax.__version__, "jaxspec": jaxspec.__version__,
          "backend": jax.default_backend(), "target": repr(target), "draft": repr(draft), "sentences": len(ids),
          "prompt_tokens": [len(i) for i in ids], "max_new_tokens": _MAX_NEW.value, "repeats": _REPEATS.value,
          "probe_repeats": _PROBE_REPEATS.value, "command": shlex.join(["python"] + sys.argv),
          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_average_before": os.getloadavg()[0],
          "date": time.strftime("%Y-%m-%d %H:%M")}
  variants = [sweep.Variant(FLAGS.draft, g, s) for s in _SCHEDULES.value for g in FLAGS.gammas]
  rows = sweep.measure(target, {FLAGS.draft: draft}, variants, ids, FLAGS.temperatures, FLAGS.batch_sizes,
                       _REPEATS.value, _MAX_NEW.value, speculation=tune.calibrated({FLAGS.draft: draft}),
                       probe_repeats=_PROBE_REPEATS.value, keep_tokens=_PEER.value)
  peer_rows = []
  if _PEER.value:
    greedy = next((r["plain_token_ids"] for r in rows if r["batch"] == 1 and r["temperature"] == 0), None)
    sources = peer.hf_source(target), peer.hf_source(draft)
    del target, draft  # transformers loads its own copy: free ours when it was read from an HF directory
    try:
      peer_rows = peer.run_peer(*sources, ids, FLAGS.gammas, _REPEATS.value, _MAX_NEW.value, reference=greedy)
    except Exception as e:  # pylint: disable=broad-except
      # The peer is a comparison, not the product: report its failure and keep jaxspec's results.
      print(f"transformers peer failed: {type(e).__name__}: {e}", flush=True)
      peer_rows = [{"error": f"{type(e).__name__}: {e}"}]
  meta["load_average_after"] = os.getloadavg()[0]
  if not jaxspec.is_main_process():  # Every process ran the same sweep; process 0 writes it.
    return
  paths = report.write_benchmark(_OUT.value, rows, peer_rows, meta)
  print(report.markdown(rows, peer_rows, meta))
  print("written: " + ", ".join(f"{kind} {path}" for kind, path in paths.items()))


if __name__ == "__main__":
  cli_flags.run(main)
