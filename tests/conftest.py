"""Shared fixtures: tiny random T5 checkpoints written by transformers, one per T5 family."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One persistent XLA compilation cache for the whole run, fresh each run (a clean clone and a rerun compile the
# same). Many tests compile the same programs again (new jit closures over the same shapes, and the launch-script
# tests in subprocesses, which inherit these variables); the cache keys on the optimised program, so a hit is the
# same executable. Set before jax is imported; pytest-xdist's workers inherit it from the controller.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile
  _CACHE = tempfile.mkdtemp(prefix="jaxspec-test-xla-cache-")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  # Compilation dominates the tests on their tiny models: compile for compile time (LLVM at -O0, and the faster
  # emitters and one codegen part where this XLA has them), as the tests' subprocesses do
  # (script_helpers.xla_test_flags).
  from script_helpers import xla_test_flags  # pylint: disable=import-outside-toplevel
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {xla_test_flags()}".strip()

# Tiny shapes of each public T5 family. "odd": heads * d_kv != d_model and more encoder than decoder layers.
FAMILIES = {
    "t5_v1_0": dict(feed_forward_proj="relu"),  # tied embeddings, decoder output scaled by d_model**-0.5
    "t5_v1_1": dict(feed_forward_proj="gated-gelu", untie=True),  # also Flan-T5
    "mt5": dict(feed_forward_proj="gated-gelu", untie=True, mt5=True),
    "odd": dict(feed_forward_proj="relu", d_kv=6, num_heads=3, num_layers=3, num_decoder_layers=2),
}


def write_hf_t5(directory: str, family: str, vocab_size: int = 96, d_model: int = 16, seed: int = 0,
                **overrides) -> str:
  """Writes a random-weight T5ForConditionalGeneration of `family` with save_pretrained; returns the dir."""
  import torch
  from transformers import MT5Config, MT5ForConditionalGeneration, T5Config, T5ForConditionalGeneration
  spec = dict(FAMILIES[family])
  untie, mt5 = spec.pop("untie", False), spec.pop("mt5", False)
  kwargs = dict(vocab_size=vocab_size, d_model=d_model, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
                dropout_rate=0.0, decoder_start_token_id=0, relative_attention_num_buckets=8, relative_attention_max_distance=20)
  kwargs.update(spec)
  kwargs.update(overrides)
  torch.manual_seed(seed)
  model = (MT5ForConditionalGeneration(MT5Config(**kwargs)) if mt5 else
           T5ForConditionalGeneration(T5Config(**kwargs))).eval()
  model.save_pretrained(directory)
  if untie:
    # transformers 5 always writes T5 with a tied lm_head; real T5 1.1 / Flan-T5 / mT5 files carry their own
    # lm_head.weight and tie_word_embeddings=false. Write that, as the hub files are.
    from safetensors.numpy import load_file, save_file
    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    rng = np.random.RandomState(seed + 1)
    tensors["lm_head.weight"] = rng.randn(*tensors["shared.weight"].shape).astype(np.float32)
    save_file(tensors, path, metadata={"format": "pt"})
    cfg_path = os.path.join(directory, "config.json")
    with open(cfg_path) as f:
      cfg = json.load(f)
    cfg["tie_word_embeddings"] = False
    cfg.pop("scale_decoder_outputs", None)
    with open(cfg_path, "w") as f:
      json.dump(cfg, f)
  return directory


def load_hf_reference(directory: str):
  """transformers' own model from the directory (torch, CPU, eval mode)."""
  from transformers import AutoModelForSeq2SeqLM
  return AutoModelForSeq2SeqLM.from_pretrained(directory).eval()


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
  """{family: directory} of tiny random HF T5 checkpoints."""
  root = tmp_path_factory.mktemp("hf")
  return {name: write_hf_t5(str(root / name), name) for name in FAMILIES}


# The test files of at least 20 s in the last full run, slowest first (tests/README.md's table holds the first 20
# with their measured seconds: keep both current). Two xdist workers take a file each at a time in collection order
# (`--dist loadfile --no-loadscope-reorder`): longest first, so the run ends on short files, not on one worker
# finishing a long file alone while the other idles. A file not listed keeps its place after them.
HEAVY_FILES = (
    "tests/bench/test_tune.py",
    "tests/serving/test_slot_engine.py",
    "tests/serving/test_slot_engine_drafters.py",
    "tests/sharding/test_sharding.py",
    "tests/decoding/test_decoder_only_generate.py",
    "tests/serving/test_server_hosts.py",
    "tests/test_notebook.py",
    "tests/serving/test_budget.py",
    "tests/decoding/test_adaptive.py",
    "tests/decoding/test_head_drafter.py",
    "tests/training/test_ende_pipeline.py",
    "tests/decoding/test_head_trees.py",
    "tests/decoding/test_sampling_lossless.py",
    "tests/decoding/test_generate.py",
    "tests/models/test_tree_step.py",
    "tests/bench/test_gpu_round3.py",
    "tests/serving/test_server.py",
    "tests/serving/test_slot_engine_mesh.py",
    "tests/serving/test_slot_engine_hosts.py",
    # from here: not in tests/README.md's table
    "tests/cli/test_launch_generate.py",
    "tests/bench/test_benchmark.py",
    "tests/serving/test_drafter_stays_current.py",
    "tests/training/test_launch_train.py",
    "tests/serving/test_hostile.py",
    "tests/decoding/test_cross_head_drafter.py",
    "tests/serving/test_slot_engine_eos.py",
    "tests/cli/test_launch_translate.py",
    "tests/serving/test_slot_engine_sampling.py",
    "tests/cli/test_cli_safety.py",
    "tests/training/test_pair_v2_pipeline.py",
    "tests/training/test_train_head.py",
    "tests/serving/test_guidellm.py",
    "tests/decoding/test_tree_generate.py",
    "tests/serving/test_slot_memory.py",
    "tests/serving/test_soak_server.py",
    "tests/models/test_eagle3_tree_step.py",
    "tests/models/test_features.py",
    "tests/test_reliability.py",
    "tests/cli/test_launch_tools.py",
    "tests/decoding/test_streaming.py",
    "tests/bench/test_oracle_drafter.py",
    "tests/decoding/test_cross_head_sampling.py",
)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering within files (module-scoped parameters)
def pytest_collection_modifyitems(items):
  """Puts the tests of HEAVY_FILES first, in that order; every other test keeps its collected order."""
  rank = {path: i for i, path in enumerate(HEAVY_FILES)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(HEAVY_FILES)))
