r"""What streaming costs: generate(..., on_tokens=callback) against on_tokens=None, timed side by side.

    nice -n 5 .venv/bin/python docs/bench/adaptive/streaming.py            # writes docs/bench/adaptive/streaming.json

The embedded pair (ende-target / ende-draft), the first --sentences natural sentences of dev.tsv, one sentence per
call (batch 1) and in batches of 4. For plain decoding, constant gamma 4 and adaptive gamma 4 (knobs off), each
with on_tokens=None and with a callback that only collects the chunks: one warm-up pass each (compilation), then
--repeats interleaved rounds (jaxspec.bench.timing.interleaved_passes), the median pass. Prints ms/token for both, the
cost of streaming in percent, and the inter-token latency (ms between a row's deliveries) seen by the callback;
checks that the chunks concatenate to the output.
"""

import argparse
import json
import os
import platform
import time

import jax
import numpy as np

import jaxspec
from jaxspec.bench import timing
from jaxspec.bench.sweep import fixed_batches
from jaxspec.data.ende import read_pairs, split_path
from jaxspec.tools.inputs import encode_texts


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--sentences", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--batch_sizes", default="1,4")
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "streaming.json"))
  args = parser.parse_args()

  target, draft = jaxspec.load("ende-target"), jaxspec.load("ende-draft")
  texts = [p.en for p in read_pairs(split_path("dev")) if p.is_natural][:args.sentences]
  ids = encode_texts(target.tokenizer, texts, max_input_length=512)
  decoders = {"plain": {}, "constant gamma 4": dict(speculation=jaxspec.Speculation(draft, gamma=4)),
              "adaptive gamma 4": dict(speculation=jaxspec.Speculation(draft, gamma=4, schedule="adaptive"))}
  rows = []
  for batch in map(int, args.batch_sizes.split(",")):
    batches = fixed_batches(ids, batch)
    chunks, gaps = [], {}
    fns = {}
    for name, kw in decoders.items():
      def call(b, kw=kw):
        return jaxspec.generate(target, b, max_new_tokens=args.max_new_tokens, **kw)

      def call_streaming(b, kw=kw, name=name):
        chunks.clear()
        out = jaxspec.generate(target, b, max_new_tokens=args.max_new_tokens, on_tokens=chunks.append, **kw)
        streamed = [[] for _ in b]
        for c in chunks:
          for row, new in enumerate(c.rows()):
            streamed[row] += new
        assert all(s == o[:n].tolist() for s, o, n in zip(streamed, out.tokens, out.lengths)), "chunks != output"
        # time between consecutive iterations' deliveries (every row that is not finished gets tokens in each)
        gaps.setdefault(name, []).extend(1e3 * (y.time - x.time) for x, y in zip(chunks, chunks[1:]))
        return out
      fns[(name, False)], fns[(name, True)] = call, call_streaming
    timed, _ = timing.interleaved_passes(fns, batches, args.repeats)
    for name in decoders:
      off, on = timed[(name, False)], timed[(name, True)]
      tokens = sum(int(o.lengths.sum()) for o in off.outputs)
      row = {"batch": batch, "decoder": name, "tokens": tokens,
             "ms_per_token_off": 1e3 * off.median_s / tokens, "ms_per_token_on": 1e3 * on.median_s / tokens,
             "streaming_cost_percent": 100 * (on.median_s / off.median_s - 1),
             "iterations": int(sum(o.stats.iterations.max() for o in off.outputs)),
             "itl_ms_between_chunks": timing.percentiles(gaps[name]) if gaps.get(name) else {},
             "identical_outputs": all(np.array_equal(x.tokens, y.tokens) for x, y in zip(off.outputs, on.outputs))}
      rows.append(row)
      print(f"batch {batch} {name}: off {row['ms_per_token_off']:.3f} on {row['ms_per_token_on']:.3f} ms/token "
            f"({row['streaming_cost_percent']:+.1f}%), {row['iterations']} iterations, chunk gaps p50/p90/p99 "
            + " / ".join(f"{v:.2f}" for v in row["itl_ms_between_chunks"].values()) + " ms", flush=True)
    jax.clear_caches()
  meta = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "jax": jax.__version__,
          "sentences": len(ids), "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
          "date": time.strftime("%Y-%m-%d %H:%M"), "load_average": os.getloadavg()[0]}
  with open(args.output, "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=1)
  print(f"written: {args.output}")


if __name__ == "__main__":
  main()
