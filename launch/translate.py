r"""The main job: English -> German with a T5 target and a T5 draft, speculatively, next to plain decoding.

    python launch/translate.py                                  # embedded pair, built-in sample sentences
    python launch/translate.py --input=news.txt --output=news.de.txt --gamma=3
    echo "The house is small." | python launch/translate.py --input=- --nocompare
    python launch/translate.py --target=/path/to/t5-11b --draft=/path/to/t5-small \
        --prefix="translate English to German: " --input=newstest2014.en

Prints the translations, then a summary: alpha, tokens per iteration, acceptance per draft position, wall time
per token of plain and speculative decoding measured side by side in this run (compilation excluded), the
speedup, the speedup the paper's formula predicts from the measured alpha, c and r, and at temperature 0 a check
that both outputs are identical. With --output, lines are written as they are translated and a rerun resumes
after the last line written.
"""

import os
import sys
import time

import numpy as np
from absl import app, flags, logging

import jaxspec
from jaxspec import benchmarking
from jaxspec.data.ende import read_pairs
from jaxspec.decoding.engine import bucket_length

_TARGET = flags.DEFINE_string("target", "ende-target", "Target model: embedded name or model directory.")
_DRAFT = flags.DEFINE_string("draft", "ende-draft", "Draft model: embedded name or model directory.")
_GAMMA = flags.DEFINE_integer("gamma", 3, "Draft tokens per iteration.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 = greedy (exact target greedy output).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k sampling (0 = off).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass in (0, 1] (1 = off).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens generated per sentence at most.")
_MAX_INPUT = flags.DEFINE_integer("max_input_length", 128, "Longest input in tokens (EOS included).")
_LONG = flags.DEFINE_enum("long_inputs", "truncate", ["truncate", "refuse"],
                          "Inputs longer than --max_input_length: truncate with a warning, or refuse to run.")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Sentences per generate call.")
_INPUT = flags.DEFINE_string("input", "", "A text file (one sentence a line), a TSV with an 'en' column, '-' for "
                             "stdin, or empty for the built-in sample.")
_OUTPUT = flags.DEFINE_string("output", "", "Where translations go, one per input line (resumable).")
_PREFIX = flags.DEFINE_string("prefix", "", "Text put before every input, e.g. 'translate English to German: '.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_COMPARE = flags.DEFINE_boolean("compare", True, "Also decode plainly and time both side by side.")

SAMPLE = os.path.join(os.path.dirname(jaxspec.__file__), "embedded", "samples", "ende_sample.tsv")


def read_inputs(spec: str) -> list[str]:
  if spec == "-":
    return [line.rstrip("\n") for line in sys.stdin]
  path = spec or SAMPLE
  if not os.path.exists(path):
    raise SystemExit(f"--input {path}: no such file.")
  if path.endswith((".tsv", ".tsv.gz")):
    return [p.en for p in read_pairs(path)]
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f]


def encode_all(model, texts, prefix, max_len, long_inputs):
  """Token ids per line (None for empty lines), truncated or refused past max_len."""
  out = []
  for i, text in enumerate(texts):
    if not text.strip():
      logging.warning("line %d is empty: its output line stays empty.", i + 1)
      out.append(None)
      continue
    ids = model.tokenizer.encode(prefix + text)
    if len(ids) > max_len:
      if long_inputs == "refuse":
        raise SystemExit(f"line {i + 1} has {len(ids)} tokens, more than --max_input_length={max_len} "
                         f"(use --long_inputs=truncate to cut it).")
      logging.warning("line %d has %d tokens: truncated to %d.", i + 1, len(ids), max_len)
      ids = ids[:max_len - 1] + [model.config.eos_token_id]
    out.append(ids)
  return out


def _progress(done: int, total: int, start: float) -> None:
  if total <= 1 or not sys.stderr.isatty():
    return
  rate = done / max(time.time() - start, 1e-9)
  sys.stderr.write(f"\r{done}/{total} lines | {rate:.1f} lines/s | ETA {(total - done) / max(rate, 1e-9):.0f} s")
  sys.stderr.flush()


def main(argv):
  del argv
  try:
    target = jaxspec.load(_TARGET.value)
    draft = jaxspec.load(_DRAFT.value) if _DRAFT.value else None
  except jaxspec.CheckpointError as e:
    raise SystemExit(f"cannot load model: {e}") from None
  if target.tokenizer is None:
    raise SystemExit(f"{_TARGET.value} has no tokenizer: translate.py needs text in and out.")
  if draft is not None and draft.tokenizer is not None and not draft.tokenizer.same_as(target.tokenizer):
    raise SystemExit(f"the draft's tokenizer ({_DRAFT.value}) differs from the target's ({_TARGET.value}): "
                     "speculative decoding needs the same token ids on both sides.")
  texts = read_inputs(_INPUT.value)
  encoded = encode_all(target, texts, _PREFIX.value, _MAX_INPUT.value, _LONG.value)
  done = 0
  out_file = None
  if _OUTPUT.value:
    if os.path.exists(_OUTPUT.value):
      with open(_OUTPUT.value, encoding="utf-8") as f:
        done = sum(1 for _ in f)
      if done:
        print(f"resuming: {done} of {len(texts)} lines already in {_OUTPUT.value}", file=sys.stderr)
    out_file = open(_OUTPUT.value, "a", encoding="utf-8")  # pylint: disable=consider-using-with

  knobs = dict(max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
               top_p=_TOP_P.value, seed=_SEED.value, max_input_length=_MAX_INPUT.value)
  spec_kw = dict(draft=draft, gamma=_GAMMA.value) if draft is not None else {}
  totals = {"plain_s": 0.0, "spec_s": 0.0, "tokens": 0, "identical": True}
  all_stats, compile_s, warmed = [], {}, set()
  start = time.time()
  todo = [i for i in range(done, len(texts))]
  batch = _BATCH.value
  for k in range(0, len(todo), batch):
    idx = todo[k:k + batch]
    rows = [encoded[i] for i in idx if encoded[i] is not None]
    results = {}
    if rows:
      padded = rows + [rows[-1]] * (batch - len(rows))  # constant batch size: one compilation
      bucket = bucket_length(max(map(len, padded)), _MAX_INPUT.value)
      if bucket not in warmed:  # warm-up: compile both programs for this prompt bucket outside the timings
        warmed.add(bucket)
        t0 = time.perf_counter()
        jaxspec.generate(target, padded, **spec_kw, **knobs)
        compile_s["speculative"] = compile_s.get("speculative", 0.0) + time.perf_counter() - t0
        if _COMPARE.value and draft is not None:
          t0 = time.perf_counter()
          jaxspec.generate(target, padded, **knobs)
          compile_s["plain"] = compile_s.get("plain", 0.0) + time.perf_counter() - t0
      t0 = time.perf_counter()
      spec = jaxspec.generate(target, padded, **spec_kw, **knobs)
      totals["spec_s"] += time.perf_counter() - t0
      totals["tokens"] += int(spec.lengths[:len(rows)].sum())
      all_stats.append(spec.stats.select(slice(0, len(rows))))  # not the rows that only pad the batch
      if _COMPARE.value and draft is not None:
        t0 = time.perf_counter()
        plain = jaxspec.generate(target, padded, **knobs)
        totals["plain_s"] += time.perf_counter() - t0
        totals["identical"] &= bool(np.array_equal(plain.tokens, spec.tokens))
      j = 0
      for i in idx:
        if encoded[i] is not None:
          results[i] = spec.texts[j]
          j += 1
    for i in idx:
      line = results.get(i, "")
      if out_file:
        out_file.write(line + "\n")
      else:
        print(f"{texts[i]}\n  -> {line}")
    if out_file:
      out_file.flush()
    _progress(k + len(idx), len(todo), start)
  if out_file:
    out_file.close()
    if sys.stderr.isatty():
      sys.stderr.write("\n")
  if not all_stats:
    print("nothing to translate.")
    return
  summarize(target, draft, all_stats, totals, compile_s)


def summarize(target, draft, all_stats, totals, compile_s):
  stats = jaxspec.DecodeStats.concatenate(all_stats)
  generated, alpha = int(stats.generated.sum()), stats.alpha
  print(f"\n== summary: {generated} tokens, batch {_BATCH.value}, temperature {_TEMPERATURE.value} ==")
  print("compile + first call, summed over the prompt-length buckets seen: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in compile_s.items()))
  if draft is None:
    print(f"plain decoding: {1e3 * totals['spec_s'] / max(totals['tokens'], 1):.2f} ms/token")
    return
  print(f"gamma {_GAMMA.value} | alpha {alpha:.3f} | tokens per iteration {stats.tokens_per_iteration:.2f} "
        f"(bonus token included)")
  print("acceptance per draft position: " + " ".join(f"{a:.2f}" for a in stats.acceptance_per_position))
  spec_ms = 1e3 * totals["spec_s"] / max(totals["tokens"], 1)
  print(f"speculative: {spec_ms:.2f} ms/token")
  if _COMPARE.value:
    plain_ms = 1e3 * totals["plain_s"] / max(totals["tokens"], 1)
    costs = benchmarking.cost_ratios(target, draft, _GAMMA.value, batch=_BATCH.value)
    a, g = min(alpha, 1.0), _GAMMA.value
    expected = jaxspec.expected_speedup(a, g, costs["c"], costs["r"])
    print(f"plain:       {plain_ms:.2f} ms/token")
    print(f"speedup {plain_ms / spec_ms:.2f}x measured | expected {expected:.2f}x from Theorem 3.8 with the "
          f"measured alpha {alpha:.2f}, c {costs['c']:.3f}, r {costs['r']:.2f} "
          f"({jaxspec.expected_speedup(a, g, costs['c']):.2f}x if r were 1); "
          f"{jaxspec.expected_speedup(a, g, costs['c_alternating'], costs['r']):.2f}x with the draft's cost "
          f"between target calls (c {costs['c_alternating']:.3f})")
    if _TEMPERATURE.value == 0:
      print(f"temperature 0: speculative output identical to plain greedy output: {totals['identical']}")
      if not totals["identical"]:
        raise SystemExit("speculative and plain greedy outputs differ")


if __name__ == "__main__":
  app.run(main)
