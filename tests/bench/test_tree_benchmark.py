"""launch/tree_benchmark.py on a decoder-only pair (chat prompts from a JSONL file, --output_name, --lookup=false,
transformers beside it), and what it reports apart from the timed passes: each variant's warm-up pass and JAX's
compilation in it (`jaxspec.bench.timing.compile_time`).

Tiny random Qwen2 checkpoints (tests/decoder_only_models.py); no timing is asserted, only that the times are there.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp

from decoder_only_models import write_hf_decoder
from jaxspec.bench import timing
from script_helpers import script_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


def test_compile_time_counts_compilations_only():
  f = jax.jit(lambda x: jnp.tanh(x) * 3.0 + 1.0)
  x = jnp.arange(7.0)
  x.block_until_ready()
  with timing.compile_time() as first:
    f(x).block_until_ready()
  with timing.compile_time() as again:  # the same shapes: JAX's in-memory cache, nothing compiled
    f(x).block_until_ready()
  assert first.executables == 1 and first.seconds > 0
  assert again.executables == 0 and again.seconds == 0


def test_tree_benchmark_decoder_only_chats_with_peer(tmp_path):
  target = write_hf_decoder(str(tmp_path / "target"), "qwen2", seed=0)
  draft = write_hf_decoder(str(tmp_path / "draft"), "qwen2", seed=1, num_hidden_layers=1)
  prompts = tmp_path / "chats.jsonl"
  texts = ["the cat reads a book.", "a small dog runs over the river.", "green tree."]
  prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts))
  out = tmp_path / "bench"
  res = subprocess.run([sys.executable, "launch/tree_benchmark.py", f"--target={target}", f"--draft={draft}",
                        f"--input={prompts}", "--sentences=2", "--gamma=2", "--trees=2,4", "--lookup=false",
                        "--temperatures=0", "--batch_sizes=1", "--repeats=1", "--probe_repeats=1", "--probe_calls=1",
                        "--max_new_tokens=6", f"--output_dir={out}", "--output_name=trees_chat"],
                       cwd=ROOT, capture_output=True, text=True, env=script_env(OMP_WAIT_POLICY="PASSIVE"), timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  assert sorted(os.listdir(out)) == ["trees_chat.json", "trees_chat.md"]
  results = json.loads((out / "trees_chat.json").read_text())
  meta, rows = results["meta"], results["rows"]
  assert meta["sentences"] == 2 and len(meta["prompt_tokens"]) == 2
  assert set(meta["stages_s"]) == {"load", "jaxspec", "transformers"}
  assert [r["variant"] for r in rows] == ["plain", "draft chain gamma=2", "draft tree K=2 N=4 gamma=2"]
  for r in rows:
    assert r["compile_and_first_pass_s"] >= r["compile_s"] > 0
    assert r["median_pass_s"] > 0 and r["probe_s"] > 0
  for r in rows[1:]:
    assert r["identical_to_plain"] is True and r["r"] > 0
  greedy = rows[0]["token_ids"]
  assert len(greedy) == 2 and all(1 <= len(t) <= 6 for t in greedy)
  (p,) = results["peer"]
  assert p["gamma"] == 2 and p["assisted_identical_to_plain"] is True
  assert p["plain_equals_jaxspec"] == [True, True], p["plain_mismatches"]
  md = (out / "trees_chat.md").read_text()
  assert "| compile s |" in md and "2 of 2 inputs" in md and "Wall time of the run" in md
