"""launch/train_pair_v2.py end to end with tiny shapes on a tiny corpus (the pipeline a lent GPU runs in one call).

Target training, distillation, the draft with KL to the target, packing into archive parts, the evaluations; the
parts must restore loadable models whose speculative greedy output equals the target's. Each model compiles one
train program per length bucket (two here: 16 and 32), ahead of time, and summary.json times every stage.
"""

import io
import json
import os
import tarfile

import numpy as np
import pytest

import jaxspec
from jaxspec.checkpoint.safetensors_io import SafetensorsFile
from jaxspec.data.ende import DOMAINS, distillation_sources, read_pairs, write_pairs
from jaxspec.tokenizer import load_tokenizer
from script_helpers import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
TOKENIZER_V2 = os.path.join(ROOT, "configs", "ende_tokenizer")
TINY = {"d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 2}
COMMON = ["max_len=32", "length_buckets=16", "tokens_per_batch=256", "log_every=2", "eval_every=2",
          "dev_loss_pairs=16", "warmup_steps=2", "compute_dtype=float32"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """200 pairs of the three domains from the repository's samples (natural, software, documentation)."""
  root = tmp_path_factory.mktemp("corpus")
  sample = read_pairs(os.path.join(ROOT, "jaxspec", "embedded", "samples", "ende_sample.tsv"))
  docs = read_pairs(os.path.join(ROOT, "docs", "corpus_sample.tsv"))
  write_pairs(str(root / "train.tsv.gz"), sample + docs)
  write_pairs(str(root / "dev.tsv"), sample[::3])
  write_pairs(str(root / "test.tsv"), sample[1::3])
  write_pairs(str(root / "dev_doc.tsv"), docs[::15])
  write_pairs(str(root / "test_doc.tsv"), docs[1::15])
  return root


def _unpack(out, name, dest):
  parts = sorted(p for p in os.listdir(out) if p.startswith(f"{name}.tar.part"))
  data = b"".join((out / p).read_bytes() for p in parts)
  with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    tar.extractall(dest, filter="data")
  return parts, dest / name


def test_pipeline_end_to_end(corpus, tmp_path):
  out, work = tmp_path / "out", tmp_path / "work"
  args = ["launch/train_pair_v2.py", f"--corpus={corpus}", f"--out={out}", f"--workdir={work}",
          "--distill_pairs=195", "--dev_pairs=16", "--batch_size=64", "--eval_per_domain=8",
          "--alpha_sentences=0", "--shard_bytes=60000", "--part_bytes=100000", "--deadline_s=100000"]
  for name, steps, budget in (("target", 4, 1000), ("draft", 10**6, 3)):  # The draft stops at its time budget.
    args += [f"--{name}_config.{k}" for k in COMMON + [f"train_steps={steps}", f"time_budget_s={budget}"]]
    args += [f"--{name}_config.model.{k}={v}" for k, v in TINY.items()]
  res = run_script(args)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  assert "stopped by the time budget (3 s)" in res.stdout  # the draft's; the target stopped at its 4 steps
  assert "do not fit" not in res.stdout  # the draft's programs, compiled while the target trained, were used

  summary = json.loads((out / "summary.json").read_text())
  print(json.dumps({k: summary[k] for k in ("stages_s", "environment")}), json.dumps(summary["target"]["timings"]),
        json.dumps(summary["draft"]["timings"]))
  assert summary["target"]["step"] == 4 and summary["target"]["exported"]["step"] in (2, 4)
  for model in ("target", "draft"):  # one compiled train program per bucket, each timed; the stages' seconds
    timings = summary[model]["timings"]
    assert timings["train_programs"] == 2, json.dumps(timings)
    assert sorted(timings["compile_s"]) == ["train_step[16x16]", "train_step[8x32]"]
    assert all(v > 0 for v in timings["compile_s"].values()) and timings["eval_compile_s"] > 0
    for key in ("setup_s", "tokenize_s", "compile_wait_s", "eval_s", "export_s"):
      assert timings[key] >= 0, key
    assert timings["steps_s"] > 0 and timings["steps_per_s"] > 0 and timings["tokens_per_s"] > 0, json.dumps(timings)
    assert timings["steps"] == summary[model]["step"] and 0 < timings["step_share"] < 1
  stages = {k: v for k, v in summary["stages_s"].items() if k != "ended_s"}
  assert set(stages) == {"target", "pack_target", "distill", "test_eval", "draft", "pack_draft"}
  assert all(v > 0 for v in stages.values())
  assert summary["environment"]["backend"] == "cpu" and "xla_flags" in summary["environment"]
  sources = distillation_sources(read_pairs(str(corpus / "train.tsv.gz")), 195)  # those of <= 32 tokens count
  tokenizer = load_tokenizer(TOKENIZER_V2)
  kept = [p for p in sources if len(tokenizer.encode(p.en)) <= 32]
  assert summary["distill"]["pairs"] == {d: sum(p.domain == d for p in kept) for d in DOMAINS}
  assert 0 < summary["distill"]["dev_pairs"] <= 16
  test = summary["target"]["test"]
  for domain in ("natural", "software", "documentation"):
    assert 0 <= test[f"bleu_{domain}"] <= 100 and 0 <= test[f"chrf_{domain}"] <= 100
  assert 0 < summary["draft"]["step"] < 10**6 and 0 <= summary["draft"]["dev_acc_natural"] <= 1
  assert "alpha_dev_natural" not in summary and summary["done"]["total_s"] > 0
  distilled = read_pairs(str(work / "distill" / "train.tsv.gz"))
  assert all(p.source.startswith("distilled:") for p in distilled)
  assert [p.domain for p in distilled] == sorted((p.domain for p in distilled), key=["natural", "documentation",
                                                                                    "software"].index)

  for name in ("ende-target", "ende-draft"):
    assert sorted(summary[name.split("-")[1]]["files"]) == sorted(
        p for p in os.listdir(out) if p.startswith(name))
  assert all(os.path.getsize(out / p) <= 100000 for p in os.listdir(out))
  parts, target_dir = _unpack(out, "ende-target", tmp_path / "models")
  assert len(parts) > 1  # the archive was cut into parts, and they join back
  _, draft_dir = _unpack(out, "ende-draft", tmp_path / "models")
  shards = [str(target_dir / f) for f in os.listdir(target_dir) if f.endswith(".safetensors")]
  assert len(shards) > 1  # each under --shard_bytes unless it holds one bigger tensor (the embedding)
  assert all(os.path.getsize(f) <= 60000 or len(SafetensorsFile(f).keys()) == 1 for f in shards)
  assert (target_dir / "model.safetensors.index.json").exists()

  target, draft = jaxspec.load(str(target_dir)), jaxspec.load(str(draft_dir))
  assert target.config.d_model == 16 and target.tokenizer.same_as(draft.tokenizer)
  texts = [p.en for p in read_pairs(str(corpus / "test.tsv"))[:4]]
  plain = jaxspec.generate(target, texts, max_new_tokens=12)
  spec = jaxspec.generate(target, texts, jaxspec.Speculation(draft, gamma=3), max_new_tokens=12)
  np.testing.assert_array_equal(plain.tokens, spec.tokens)
