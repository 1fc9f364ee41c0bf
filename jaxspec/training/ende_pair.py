r"""The v2 EN-DE pair in one accelerator call: target, distillation, draft, exports (docs/ende_pair.md, "v2").
`run(PairSettings(...)) -> summary`; launch/train_pair_v2.py is its command line (flags -> `PairSettings`), a
notebook calls `run` (or one stage) with configs/ende.py's configs.

Stages, each bounded by the clock so that all of it ends by `deadline_s` after the start:
  1. the target (configs/ende.py:target_v2, its time budget capped to leave room for the rest), exported at its
     best dev loss, then packed into `out` (`train_target`);
  2. its greedy translations of dev sources (the draft's dev set) and of training sources by domain priority
     (natural sentences, documentation, software strings) until `distill_s` (`distill_for_draft`); then its test
     BLEU/chrF per domain (`evaluate_target`);
  3. the draft (configs/ende.py:draft_v2) on those translations with token-level KL to the target, packed
     (`train_draft`);
  4. with time left, alpha of speculative decoding on natural dev sentences (`measure_alpha`).
Files: WORKDIR/target and WORKDIR/draft (each model's training directory, its export in .../export),
WORKDIR/distill/{train,dev}.tsv.gz (the distilled pairs), WORKDIR/hf/<name> (the packed models' HF directories).
Packing (`pack`): the model in bfloat16 as HF safetensors sharded below `shard_bytes`, with config and tokenizer,
tarred and cut into OUT/<name>.tar.partNN files below `part_bytes` (what the device returns: few files, each
< 16 MB); `cat <name>.tar.part* | tar -x` restores the directory. OUT/summary.json grows after every stage
(`run` returns it).

Compilation (issue 32): each model compiles one train program per length bucket (configs/ende.py: two), ahead
of time in a thread while its corpus is tokenized; the draft's start compiling when the target's are done, so
they are ready when the target has trained. summary.json's "timings" (per model) give the seconds of setup,
tokenizing, each compile and the wait for it, steps, evaluations, export, and steps/s and tokens/s; the
pipeline adds distillation, test evaluation and packing seconds ("stages_s") and the XLA_FLAGS in force
(launch/train_pair_gpu.sh passes XLA's GPU autotune level there: XLA_GPU_AUTOTUNE_LEVEL=0 bash ...).

Errors name the script's flags (`--corpus`, `--deadline_s`, `--draft_config.time_budget_s`): each is the
`PairSettings` field of that name.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os
import tarfile
import time
from typing import Any

import jax
import jax.numpy as jnp

import jaxspec
from jaxspec.bench import quality
from jaxspec.checkpoint.safetensors_io import shard_safetensors
from jaxspec.data.ende import (DOMAINS, by_domain, distillation_sources, evenly_spaced, read_pairs, read_splits,
                               split_path, write_pairs)
from jaxspec.errors import ConfigError, InputError
from jaxspec.models import t5
from jaxspec.tokenizer import load_tokenizer
from jaxspec.tools.outputs import atomic_write_json
from jaxspec.training.loop import distill, prepare_programs, tokenizer_dir, train_and_evaluate

EXPORT_S = 25  # What the stages after distillation need beyond the draft's budget (its export, packing).


@dataclasses.dataclass(frozen=True)
class PairSettings:
  """What one run takes (launch/train_pair_v2.py's flags, one field each, of the same name).

  corpus: the corpus directory (train.tsv.gz, dev/test(_doc).tsv; launch/build_corpus.py builds one).
  target_config, draft_config: configs/ende.py's target_v2 and draft_v2 (ml_collections ConfigDicts: with configs/
    on sys.path, `ende.get_config("target_v2")`; `run` sets its own copies' data, teacher and time budgets and
    leaves these as they are).
  workdir: the stages' files; out: the packed models and summary.json ('' = WORKDIR/out).
  deadline_s: seconds after the start by which everything has ended; distill_s: seconds for distilling training
    sources; distill_pairs: training sources distilled at most; dev_pairs: dev sources distilled for the draft's
    dev loss; batch_size: sentences per generate call (distillation, evaluation); eval_per_domain: test pairs per
    domain for the target's BLEU/chrF; alpha_sentences: natural dev sentences for the final alpha (0 = none).
  shard_bytes: the largest safetensors shard; part_bytes: the largest archive part in `out`.
  """

  corpus: str
  target_config: Any
  draft_config: Any
  workdir: str = "runs/pair_v2"
  out: str = ""
  deadline_s: float = 550
  distill_s: float = 70
  distill_pairs: int = 150_000
  dev_pairs: int = 1000
  batch_size: int = 512
  eval_per_domain: int = 500
  alpha_sentences: int = 256
  shard_bytes: int = 14_000_000
  part_bytes: int = 15_000_000

  @property
  def out_dir(self) -> str:
    return self.out or os.path.join(self.workdir, "out")

  def model_dir(self, model: str) -> str:
    """WORKDIR/<model>/export: where `train_target` ("target") or `train_draft` ("draft") exports."""
    return os.path.join(self.workdir, model, "export")


def pack(model_dir: str, name: str, out: str, *, workdir: str, shard_bytes: int, part_bytes: int) -> dict:
  """The model as bfloat16 sharded safetensors in WORKDIR/hf/name, tarred into out/name.tar.partNN files.

  Returns {"files": the part names, "exported": export_meta.json beside model_dir (which evaluation it is)}."""
  hf = os.path.join(workdir, "hf", name)
  jaxspec.save(jaxspec.load(model_dir, dtype=jnp.float32), hf, format="hf", dtype=jnp.bfloat16)
  shard_safetensors(hf, shard_bytes)
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w") as tar:
    tar.add(hf, arcname=name)
  data, files = buffer.getvalue(), []
  for k in range(0, len(data), part_bytes):
    files.append(os.path.join(out, f"{name}.tar.part{k // part_bytes:02d}"))
    with open(files[-1], "wb") as f:
      f.write(data[k:k + part_bytes])
  with open(os.path.join(os.path.dirname(model_dir), "export_meta.json"), encoding="utf-8") as f:
    return {"files": [os.path.basename(p) for p in files], "exported": json.load(f)}


def check_inputs(s: PairSettings) -> None:
  """What the run reads and how its clock is shared, checked before any model is built: every split it reads
  (train, the target's dev split, dev, test and test_doc) is in --corpus, is UTF-8 with an 'en<TAB>de' header, and
  train and the dev splits hold usable pairs (both sides non-empty); --distill_s > 0, and --deadline_s leaves time
  to distil after the draft's budget. InputError / ConfigError naming the flag, file and line."""
  corpus, tc, dc = s.corpus, s.target_config, s.draft_config
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
  if s.distill_s <= 0:
    raise ConfigError(f"--distill_s={s.distill_s:g}: expected seconds > 0 (the draft learns from the distillation).")
  window = s.deadline_s - dc.time_budget_s - EXPORT_S
  if window <= 1:
    raise ConfigError(f"--deadline_s={s.deadline_s:g} leaves no time to train the target and distil: the draft's "
                      f"budget (--draft_config.time_budget_s={dc.time_budget_s:g}) and {EXPORT_S} s of exports come "
                      f"after both. Raise --deadline_s or lower the draft's budget.")


class Record:
  """The run's clock and OUT/summary.json, rewritten after every stage: `note(stage, **values)` merges values into
  summary[stage] (with "ended_s", seconds since the start) and prints a line; `timed(name, fn, ...)` calls fn and
  notes its seconds under "stages_s"."""

  def __init__(self, out: str, deadline_s: float):
    self.t0, self.out, self.summary, self.stages = time.time(), out, {}, {}
    self.deadline = self.t0 + deadline_s

  def left(self) -> float:
    return self.deadline - time.time()

  def note(self, stage: str, **values) -> None:
    self.summary[stage] = {**self.summary.get(stage, {}), **values, "ended_s": round(time.time() - self.t0, 1)}
    atomic_write_json(os.path.join(self.out, "summary.json"), self.summary, indent=2)
    print(f"[{time.time() - self.t0:.0f} s] {stage}: {json.dumps(values)}", flush=True)

  def timed(self, name: str, fn, *args, **kwargs):
    t = time.time()
    result = fn(*args, **kwargs)
    self.stages[name] = round(time.time() - t, 2)
    self.note("stages_s", **self.stages)
    return result


def _dtype():
  return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def _pack(s: PairSettings, model: str, name: str) -> dict:
  return pack(s.model_dir(model), name, s.out_dir, workdir=s.workdir, shard_bytes=s.shard_bytes,
              part_bytes=s.part_bytes)


def train_target(s: PairSettings, tc, dc, rec: Record):
  """Stage 1: the target's budget (what the clock leaves after distillation, the draft and the exports), its train
  programs compiling while its corpus is tokenized and the draft's right after them (shapes only: the target's
  config is its teacher's), its training and packing. Sets tc's data_dir and time_budget_s. Returns the draft's
  programs (None without distillation loss)."""
  reserve = s.distill_s + dc.time_budget_s + 40  # Distillation, the draft, exports and packing after it.
  tc.data_dir, tc.time_budget_s = s.corpus, max(min(tc.time_budget_s or float("inf"), rec.left() - reserve), 1.0)
  tokenizer = load_tokenizer(tokenizer_dir(tc.tokenizer))
  target_programs = prepare_programs(tc, tokenizer.vocab_size).start()
  draft_programs = None
  if dc.distill_weight > 0:
    draft_tokenizer = load_tokenizer(tokenizer_dir(dc.tokenizer))
    teacher_cfg = t5.T5Config(vocab_size=tokenizer.vocab_size, **tc.model)
    draft_programs = prepare_programs(dc, draft_tokenizer.vocab_size, teacher_cfg, after=target_programs).start()
  rec.note("target", **rec.timed("target", train_and_evaluate, tc, os.path.join(s.workdir, "target"),
                                 programs=target_programs), budget_s=tc.time_budget_s)
  rec.note("target", **rec.timed("pack_target", _pack, s, "target", "ende-target"))
  return draft_programs


def distill_for_draft(s: PairSettings, tc, dc, target: jaxspec.Model, rec: Record) -> dict[str, str]:
  """Stage 2: the target's greedy translations of `dev_pairs` dev sources and of training sources by domain
  priority until `distill_s` (or the draft's start, whichever is first). Returns {"train", "dev": the written
  WORKDIR/distill TSVs}. ConfigError when no training source was distilled."""
  kw = dict(batch_size=s.batch_size, max_len=tc.max_len)
  t_distill = time.time()
  dev = distill(target, evenly_spaced(read_splits(tc.dev, s.corpus), s.dev_pairs), **kw)
  sources = distillation_sources(read_splits("train", s.corpus), s.distill_pairs)
  until, train = min(time.time() + s.distill_s, rec.deadline - dc.time_budget_s - EXPORT_S), []
  for domain in DOMAINS:
    if time.time() < until:
      train += distill(target, [p for p in sources if p.domain == domain], deadline=until, **kw)
  if not train:  # the draft would train on nothing (a raw error in its tokenizer)
    raise ConfigError(f"no training source was distilled before {time.time() - rec.t0:.0f} s (the target's training "
                      f"took the time): raise --deadline_s or --distill_s, or lower --draft_config.time_budget_s.")
  paths = {split: os.path.join(s.workdir, "distill", f"{split}.tsv.gz") for split in ("train", "dev")}
  os.makedirs(os.path.dirname(paths["train"]), exist_ok=True)
  write_pairs(paths["train"], train)
  write_pairs(paths["dev"], dev)
  rec.stages["distill"] = round(time.time() - t_distill, 2)
  rec.note("distill", pairs={d: len(ps) for d, ps in by_domain(train).items()}, dev_pairs=len(dev))
  return paths


def evaluate_target(s: PairSettings, tc, target: jaxspec.Model, rec: Record) -> None:
  """Stage 2's end: the target's BLEU/chrF on `eval_per_domain` test pairs per domain (test, test_doc)."""
  test = rec.timed("test_eval", quality.evaluate_pair, target, None, read_splits("test,test_doc", s.corpus),
                   decoders=("target",), limit_per_domain=s.eval_per_domain, batch_size=s.batch_size,
                   max_new_tokens=tc.max_len, max_input_length=tc.max_len, bar=False)
  rec.note("target", test={k: v for k, v in test["target"].items() if k != "seconds"},
           test_pairs=test["pairs_per_domain"])


def train_draft(s: PairSettings, dc, paths: dict[str, str], programs, rec: Record) -> None:
  """Stage 3: the draft on the distilled pairs (`paths`), with KL to the exported target, in what the clock leaves
  (less 20 s), then packed. Sets dc's data, teacher and time_budget_s; `programs` are `train_target`'s."""
  dc.data_dir, dc.train, dc.dev, dc.teacher = s.corpus, paths["train"], paths["dev"], s.model_dir("target")
  dc.time_budget_s = max(min(dc.time_budget_s or float("inf"), rec.left() - 20), 1.0)
  rec.note("draft", **rec.timed("draft", train_and_evaluate, dc, os.path.join(s.workdir, "draft"),
                                programs=programs), budget_s=dc.time_budget_s)
  rec.note("draft", **rec.timed("pack_draft", _pack, s, "draft", "ende-draft"))


def measure_alpha(s: PairSettings, tc, target: jaxspec.Model, rec: Record) -> None:
  """Stage 4, with `alpha_sentences` and over a minute left (speculative decoding compiles its loop per prompt
  bucket): alpha, tokens per iteration and acceptance per position of the draft at gamma 3 on natural dev
  sentences, and whether the output is the target's."""
  if not s.alpha_sentences or rec.left() <= 60:
    return
  draft = jaxspec.load(s.model_dir("draft"), dtype=_dtype())
  result = rec.timed("alpha", quality.evaluate_pair, target, draft, read_splits("dev", s.corpus), natural_only=True,
                     limit=s.alpha_sentences, decoders=("target", "speculative"), gamma=3, batch_size=64,
                     max_new_tokens=tc.max_len, max_input_length=tc.max_len, bar=False)
  rec.note("alpha_dev_natural", identical=result["speculative_identical_to_target"],
           **{k: result["speculative"][k] for k in ("alpha", "tokens_per_iteration", "acceptance_per_position")})


def run(s: PairSettings) -> dict:
  """`check_inputs`, then every stage under the clock; returns the summary (also OUT/summary.json)."""
  check_inputs(s)
  rec = Record(s.out_dir, s.deadline_s)
  os.makedirs(s.out_dir, exist_ok=True)
  rec.note("environment", backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
           jax=jax.__version__, xla_flags=os.environ.get("XLA_FLAGS", ""),
           prng_impl=str(jax.config.jax_default_prng_impl))
  tc, dc = copy.deepcopy(s.target_config), copy.deepcopy(s.draft_config)
  draft_programs = train_target(s, tc, dc, rec)
  target = jaxspec.load(s.model_dir("target"), dtype=_dtype())
  paths = distill_for_draft(s, tc, dc, target, rec)
  evaluate_target(s, tc, target, rec)
  train_draft(s, dc, paths, draft_programs, rec)
  measure_alpha(s, tc, target, rec)
  rec.note("done", total_s=round(time.time() - rec.t0, 1))
  return rec.summary
