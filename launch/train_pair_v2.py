r"""The v2 EN-DE pair in one accelerator call: target, distillation, draft, exports (docs/ende_pair.md, "v2").

    python launch/train_pair_v2.py --corpus=runs/corpus --out=$OUT     # ~9 minutes on one H100

Stages, each bounded by the clock so that all of it ends by --deadline_s after the start:
  1. the target (configs/ende.py:target_v2, its time budget capped to leave room for the rest), exported at its
     best dev loss, then packed into $OUT;
  2. its greedy translations of dev sources (the draft's dev set) and of training sources by domain priority
     (natural sentences, documentation, software strings) until --distill_s; then its test BLEU/chrF per domain;
  3. the draft (configs/ende.py:draft_v2) on those translations with token-level KL to the target, packed;
  4. with time left, alpha of speculative decoding on natural dev sentences.
Packing: the model in bfloat16 as HF safetensors sharded below --shard_bytes, with config and tokenizer, tarred
and cut into $OUT/<name>.tar.partNN files below --part_bytes (what the device returns: few files, each < 16 MB);
`cat <name>.tar.part* | tar -x` restores the directory. $OUT/summary.json grows after every stage.

Compilation (issue 32): each model compiles one train program per length bucket (configs/ende.py: two), ahead
of time in a thread while its corpus is tokenized; the draft's start compiling when the target's are done, so
they are ready when the target has trained. summary.json's "timings" (per model) give the seconds of setup,
tokenizing, each compile and the wait for it, steps, evaluations, export, and steps/s and tokens/s; the
pipeline adds distillation, test evaluation and packing seconds ("stages_s") and the XLA_FLAGS in force
(launch/train_pair_gpu.sh passes XLA's GPU autotune level there: XLA_GPU_AUTOTUNE_LEVEL=0 bash ...).
"""

import io
import json
import os
import tarfile
import time

import jax
import jax.numpy as jnp
from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags
from jaxspec.bench import quality
from jaxspec.checkpoint.safetensors_io import SafetensorsFile, save_file
from jaxspec.data.ende import (DOMAINS, by_domain, distillation_sources, evenly_spaced, read_pairs, read_splits,
                               split_path, write_pairs)
from jaxspec.tools.outputs import atomic_write_json
from jaxspec.errors import ConfigError, InputError
from jaxspec.tokenizer import load_tokenizer
from jaxspec.training.loop import distill, prepare_programs, tokenizer_dir, train_and_evaluate
from jaxspec.models import t5

CONFIGS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs"))
_TARGET = cli_flags.define_config_file("target_config", os.path.join(CONFIGS, "ende.py:target_v2"), "Target.")
_DRAFT = cli_flags.define_config_file("draft_config", os.path.join(CONFIGS, "ende.py:draft_v2"), "Draft.")
_CORPUS = flags.DEFINE_string("corpus", None, "Corpus directory (train.tsv.gz, dev/test(_doc).tsv).", required=True)
_WORK = flags.DEFINE_string("workdir", "runs/pair_v2", "Directory for the stages' files.")
_OUT = flags.DEFINE_string("out", os.environ.get("OUT", ""), "Where the packed models and summary.json go.")
_DEADLINE = flags.DEFINE_float("deadline_s", 550, "Seconds after the start by which everything has ended.")
_DISTILL_S = flags.DEFINE_float("distill_s", 70, "Seconds for distilling training sources.")
_DISTILL_PAIRS = flags.DEFINE_integer("distill_pairs", 150_000, "Training sources to distil at most.")
_DEV_PAIRS = flags.DEFINE_integer("dev_pairs", 1000, "Dev sources distilled for the draft's dev loss.")
_BATCH = flags.DEFINE_integer("batch_size", 512, "Sentences per generate call (distillation, evaluation).")
_EVAL_PAIRS = flags.DEFINE_integer("eval_per_domain", 500, "Test pairs per domain for the target's BLEU/chrF.")
_ALPHA_PAIRS = flags.DEFINE_integer("alpha_sentences", 256, "Natural dev sentences for the final alpha (0 = none).")
_SHARD = flags.DEFINE_integer("shard_bytes", 14_000_000, "Largest safetensors shard.")
_PART = flags.DEFINE_integer("part_bytes", 15_000_000, "Largest archive part in --out.")


def shard_safetensors(directory: str, max_bytes: int) -> None:
  """Splits directory/model.safetensors into model-0000i-of-0000n.safetensors + index when over max_bytes."""
  path = os.path.join(directory, "model.safetensors")
  if os.path.getsize(path) <= max_bytes:
    return
  source = SafetensorsFile(path)
  shards, size = [[]], 0
  for name in source.keys():
    nbytes = source.get(name).nbytes
    if shards[-1] and size + nbytes > max_bytes:
      shards, size = shards + [[]], 0
    shards[-1].append(name)
    size += nbytes
  weight_map = {}
  for i, names in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file({n: source.get(n) for n in names}, os.path.join(directory, file), metadata={"format": "pt"})
    weight_map.update({n: file for n in names})
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": sum(source.get(n).nbytes for n in weight_map)}, "weight_map": weight_map}, f)
  del source
  os.remove(path)


def pack(model_dir: str, name: str, out: str) -> dict:
  """The model as bfloat16 sharded safetensors in WORKDIR/hf/name, tarred into out/name.tar.partNN files.

  Returns {"files": the part names, "exported": export_meta.json beside model_dir (which evaluation it is)}."""
  hf = os.path.join(_WORK.value, "hf", name)
  jaxspec.save(jaxspec.load(model_dir, dtype=jnp.float32), hf, format="hf", dtype=jnp.bfloat16)
  shard_safetensors(hf, _SHARD.value)
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w") as tar:
    tar.add(hf, arcname=name)
  data, files = buffer.getvalue(), []
  for k in range(0, len(data), _PART.value):
    files.append(os.path.join(out, f"{name}.tar.part{k // _PART.value:02d}"))
    with open(files[-1], "wb") as f:
      f.write(data[k:k + _PART.value])
  with open(os.path.join(os.path.dirname(model_dir), "export_meta.json"), encoding="utf-8") as f:
    return {"files": [os.path.basename(p) for p in files], "exported": json.load(f)}


EXPORT_S = 25  # What the stages after distillation need beyond the draft's budget (its export, packing).


def check_inputs(corpus: str, tc, dc, deadline_s: float, distill_s: float) -> None:
  """What the run reads and how its clock is shared, checked before any model is built: every split it reads
  (train, the target's dev split, dev, test and test_doc) is in --corpus, is UTF-8 with an 'en<TAB>de' header, and
  train and the dev splits hold usable pairs (both sides non-empty); --distill_s > 0, and --deadline_s leaves time
  to distil after the draft's budget. InputError / ConfigError naming the flag, file and line."""
  if not corpus or not os.path.isdir(corpus):
    raise InputError(f"--corpus={corpus}: not a directory (launch/build_corpus.py --output_dir=DIR builds one).")
  splits = ["train"] + [s for s in dict.fromkeys(x.strip() for x in f"{tc.dev},dev,test,test_doc".split(","))
                        if s]
  for split in splits:
    path = split_path(split, corpus, flag="--corpus")
    if split == "train":
      if not read_pairs(path, limit=1):  # reads every row: a bad byte anywhere is found now, not after training
        raise InputError(f"--corpus={corpus}: {path} holds no usable pair (every row has an empty 'en' or 'de').")
    elif not read_pairs(path) and split in ("dev", tc.dev):
      raise InputError(f"--corpus={corpus}: {path} holds no usable pair (every row has an empty 'en' or 'de').")
  if distill_s <= 0:
    raise ConfigError(f"--distill_s={distill_s:g}: expected seconds > 0 (the draft learns from the distillation).")
  window = deadline_s - dc.time_budget_s - EXPORT_S
  if window <= 1:
    raise ConfigError(f"--deadline_s={deadline_s:g} leaves no time to train the target and distil: the draft's "
                      f"budget (--draft_config.time_budget_s={dc.time_budget_s:g}) and {EXPORT_S} s of exports come "
                      f"after both. Raise --deadline_s or lower the draft's budget.")


def main(argv):
  del argv
  check_inputs(_CORPUS.value, _TARGET.value, _DRAFT.value, _DEADLINE.value, _DISTILL_S.value)
  t0, work, out, summary = time.time(), _WORK.value, _OUT.value or os.path.join(_WORK.value, "out"), {}
  deadline, corpus = t0 + _DEADLINE.value, _CORPUS.value
  os.makedirs(out, exist_ok=True)
  left = lambda: deadline - time.time()

  def note(stage: str, **values) -> None:
    summary[stage] = {**summary.get(stage, {}), **values, "ended_s": round(time.time() - t0, 1)}
    atomic_write_json(os.path.join(out, "summary.json"), summary, indent=2)
    print(f"[{time.time() - t0:.0f} s] {stage}: {json.dumps(values)}", flush=True)

  stages = {}

  def timed(name: str, fn, *args, **kwargs):
    t = time.time()
    result = fn(*args, **kwargs)
    stages[name] = round(time.time() - t, 2)
    note("stages_s", **stages)
    return result

  note("environment", backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
       jax=jax.__version__, xla_flags=os.environ.get("XLA_FLAGS", ""))
  tc, dc = _TARGET.value, _DRAFT.value
  target_dir, draft_dir = (os.path.join(work, m, "export") for m in ("target", "draft"))
  reserve = _DISTILL_S.value + dc.time_budget_s + 40  # Distillation, the draft, exports and packing after it.
  tc.data_dir, tc.time_budget_s = corpus, max(min(tc.time_budget_s or float("inf"), left() - reserve), 1.0)
  # The target's programs compile while its corpus is tokenized; the draft's (shapes only: the target's config is
  # its teacher's) right after them, while the target trains.
  tokenizer = load_tokenizer(tokenizer_dir(tc.tokenizer))
  target_programs = prepare_programs(tc, tokenizer.vocab_size).start()
  draft_programs = None
  if dc.distill_weight > 0:
    draft_tokenizer = load_tokenizer(tokenizer_dir(dc.tokenizer))
    teacher_cfg = t5.T5Config(vocab_size=tokenizer.vocab_size, **tc.model)
    draft_programs = prepare_programs(dc, draft_tokenizer.vocab_size, teacher_cfg, after=target_programs).start()
  note("target", **timed("target", train_and_evaluate, tc, os.path.join(work, "target"), programs=target_programs),
       budget_s=tc.time_budget_s)
  note("target", **timed("pack_target", pack, target_dir, "ende-target", out))

  dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  target, kw = jaxspec.load(target_dir, dtype=dtype), dict(batch_size=_BATCH.value, max_len=tc.max_len)
  t_distill = time.time()
  dev = distill(target, evenly_spaced(read_splits(tc.dev, corpus), _DEV_PAIRS.value), **kw)
  sources = distillation_sources(read_splits("train", corpus), _DISTILL_PAIRS.value)
  until, train = min(time.time() + _DISTILL_S.value, deadline - dc.time_budget_s - EXPORT_S), []
  for domain in DOMAINS:
    if time.time() < until:
      train += distill(target, [p for p in sources if p.domain == domain], deadline=until, **kw)
  if not train:  # the draft would train on nothing (a raw error in its tokenizer)
    raise ConfigError(f"no training source was distilled before {time.time() - t0:.0f} s (the target's training "
                      f"took the time): raise --deadline_s or --distill_s, or lower --draft_config.time_budget_s.")
  paths = {s: os.path.join(work, "distill", f"{s}.tsv.gz") for s in ("train", "dev")}
  os.makedirs(os.path.dirname(paths["train"]), exist_ok=True)
  write_pairs(paths["train"], train)
  write_pairs(paths["dev"], dev)
  stages["distill"] = round(time.time() - t_distill, 2)
  note("distill", pairs={d: len(ps) for d, ps in by_domain(train).items()}, dev_pairs=len(dev))
  test = timed("test_eval", quality.evaluate_pair, target, None, read_splits("test,test_doc", corpus),
               decoders=("target",), limit_per_domain=_EVAL_PAIRS.value, batch_size=_BATCH.value,
               max_new_tokens=tc.max_len, max_input_length=tc.max_len, bar=False)
  note("target", test={k: v for k, v in test["target"].items() if k != "seconds"}, test_pairs=test["pairs_per_domain"])

  dc.data_dir, dc.train, dc.dev, dc.teacher = corpus, paths["train"], paths["dev"], target_dir
  dc.time_budget_s = max(min(dc.time_budget_s or float("inf"), left() - 20), 1.0)
  note("draft", **timed("draft", train_and_evaluate, dc, os.path.join(work, "draft"), programs=draft_programs),
       budget_s=dc.time_budget_s)
  note("draft", **timed("pack_draft", pack, draft_dir, "ende-draft", out))

  if _ALPHA_PAIRS.value and left() > 60:  # Speculative decoding compiles its loop per prompt bucket.
    draft = jaxspec.load(draft_dir, dtype=dtype)
    result = timed("alpha", quality.evaluate_pair, target, draft, read_splits("dev", corpus), natural_only=True,
                   limit=_ALPHA_PAIRS.value, decoders=("target", "speculative"), gamma=3, batch_size=64,
                   max_new_tokens=tc.max_len, max_input_length=tc.max_len, bar=False)
    note("alpha_dev_natural", identical=result["speculative_identical_to_target"],
         **{k: result["speculative"][k] for k in ("alpha", "tokens_per_iteration", "acceptance_per_position")})
  note("done", total_s=round(time.time() - t0, 1))


if __name__ == "__main__":
  cli_flags.run(main)
