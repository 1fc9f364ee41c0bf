r"""BLEU of the target, the draft and speculative decoding on an EN-DE split (sacrebleu, greedy by default).

    python launch/evaluate.py --split=../shared/data/ende/test.tsv --output=docs/ende_pair_eval.json
    python launch/evaluate.py --split=../shared/data/ende/dev.tsv --natural_only --limit=256   # the alpha bar

At temperature 0 the speculative output must equal the target's exactly; the script checks it line by line.
"""

import json
import platform
import re
import time

import numpy as np
from absl import app, flags

import jaxspec
from jaxspec.data.ende import read_pairs

_TARGET = flags.DEFINE_string("target", "ende-target", "Target model.")
_DRAFT = flags.DEFINE_string("draft", "ende-draft", "Draft model.")
_SPLIT = flags.DEFINE_string("split", "../shared/data/ende/test.tsv", "EN-DE TSV to evaluate on.")
_NATURAL = flags.DEFINE_boolean("natural_only", False, "Only the natural sentences (Ding examples) of the split.")
_LIMIT = flags.DEFINE_integer("limit", 0, "Evaluate N evenly spaced pairs only (0 = all).")
_GAMMA = flags.DEFINE_integer("gamma", 3, "Draft tokens per iteration for the speculative run.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Sentences per generate call.")
_OUTPUT = flags.DEFINE_string("output", "", "JSON file for the results.")


def translate(model, texts, batch, **kw):
  out, stats = [], []
  for k in range(0, len(texts), batch):
    chunk = texts[k:k + batch]
    padded = chunk + [chunk[-1]] * (batch - len(chunk))
    res = jaxspec.generate(model, padded, max_new_tokens=64, max_input_length=128, **kw)
    out += res.texts[:len(chunk)]
    stats.append(res.stats.select(slice(0, len(chunk))))  # not the rows that only pad the last batch
  return out, stats


def is_repetition_loop(text: str) -> bool:
  """A degenerate output: one character repeated 10+ times, or 8+ words of which at most a third are distinct.

  Weak models fall into such loops; a draft predicts them easily, so alpha is reported with and without them.
  """
  words = text.split()
  return bool(re.search(r"(.)\1{9,}", text)) or (len(words) >= 8 and len(set(words)) <= len(words) / 3)


def main(argv):
  del argv
  import sacrebleu
  target, draft = jaxspec.load(_TARGET.value), jaxspec.load(_DRAFT.value)
  pairs = read_pairs(_SPLIT.value)
  if _NATURAL.value:
    pairs = [p for p in pairs if p.is_natural]
  if _LIMIT.value and _LIMIT.value < len(pairs):
    pairs = [pairs[i] for i in np.linspace(0, len(pairs) - 1, _LIMIT.value).astype(int)]
  texts, refs = [p.en for p in pairs], [p.de for p in pairs]
  natural = np.array([p.is_natural for p in pairs])
  results = {"split": _SPLIT.value, "pairs": len(pairs), "machine": platform.processor() or platform.machine()}
  outputs = {}
  for name, model, kw in (("target", target, {}), ("draft", draft, {}),
                          ("speculative", target, {"draft": draft, "gamma": _GAMMA.value})):
    start = time.time()
    hyps, stats = translate(model, texts, _BATCH.value, **kw)
    outputs[name] = hyps
    entry = {"bleu": sacrebleu.corpus_bleu(hyps, [refs]).score, "seconds": time.time() - start}
    for subset, keep in (("natural", natural), ("software", ~natural)):
      if keep.any():
        entry[f"bleu_{subset}"] = sacrebleu.corpus_bleu([h for h, k in zip(hyps, keep) if k],
                                                        [[r for r, k in zip(refs, keep) if k]]).score
    if "draft" in kw:
      all_stats = jaxspec.DecodeStats.concatenate(stats)
      entry["alpha"] = all_stats.alpha
      entry["tokens_per_iteration"] = all_stats.tokens_per_iteration
      entry["acceptance_per_position"] = all_stats.acceptance_per_position.round(3).tolist()
      loops = np.array([is_repetition_loop(h) for h in outputs["target"]])
      entry["target_repetition_loops"] = int(loops.sum())
      for subset, keep in (("natural", natural), ("software", ~natural), ("without_target_loops", ~loops),
                           ("natural_without_target_loops", natural & ~loops)):
        if keep.any():
          entry[f"alpha_{subset}"] = all_stats.select(keep).alpha
    results[name] = entry
    print(name, json.dumps(entry), flush=True)
  same = sum(a == b for a, b in zip(outputs["target"], outputs["speculative"]))
  results["speculative_identical_to_target"] = f"{same}/{len(pairs)}"
  print(f"speculative output identical to the target's on {same}/{len(pairs)} sentences")
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(results, f, indent=2)
  if same != len(pairs):
    raise SystemExit("speculative greedy output differs from the target's")


if __name__ == "__main__":
  app.run(main)
