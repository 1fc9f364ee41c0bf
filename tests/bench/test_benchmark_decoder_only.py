"""launch/benchmark.py on a decoder-only pair with transformers beside it: chat prompts from a JSONL file, the peer's
rows in results.json and results.md, and greedy exactness across jaxspec and transformers.

Tiny random Qwen2 checkpoints (tests/decoder_only_models.py); no timing is asserted.
"""

import json
import os
import subprocess
import sys

from decoder_only_models import write_hf_decoder
from script_helpers import script_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


def test_benchmark_decoder_only_with_peer(tmp_path):
  target = write_hf_decoder(str(tmp_path / "target"), "qwen2", seed=0)
  draft = write_hf_decoder(str(tmp_path / "draft"), "qwen2", seed=1, num_hidden_layers=1)
  prompts = tmp_path / "chats.jsonl"
  texts = ["the cat reads a book.", "a small dog runs over the river.", "green tree."]
  prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts))
  out = tmp_path / "bench"
  env = script_env(OMP_WAIT_POLICY="PASSIVE")
  res = subprocess.run([sys.executable, "launch/benchmark.py", f"--target={target}", f"--draft={draft}",
                        f"--input={prompts}", "--gammas=2,3", "--temperatures=0", "--batch_sizes=1",
                        "--repeats=1", "--probe_repeats=1", "--max_new_tokens=8", f"--output_dir={out}"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  meta = results["meta"]
  assert meta["sentences"] == 3 and "launch/benchmark.py" in meta["command"]
  rows = results["jaxspec"]
  assert [r["gamma"] for r in rows] == [2, 3]
  greedy = rows[0]["plain_token_ids"]
  assert len(greedy) == 3 and all(1 <= len(t) <= 8 for t in greedy)
  for row in rows:
    assert row["identical_to_plain"] is True
    assert row["plain_token_ids"] == greedy
  peer = results["transformers"]
  assert [p["gamma"] for p in peer] == [2, 3], peer
  for p in peer:
    assert p["plain_equals_jaxspec"] == [True, True, True], p["plain_mismatches"]
    assert p["assisted_identical_to_plain"] is True
    for key in ("plain_ms_per_token", "assisted_ms_per_token", "speedup", "tokens_per_target_call"):
      assert isinstance(p[key], float) and p[key] > 0, key
    assert 1.0 <= p["tokens_per_target_call"] <= p["gamma"] + 1
    assert 0.0 <= p["implied_alpha"] <= 1.0
  md = (out / "results.md").read_text()
  assert "transformers assisted ms/tok" in md
  assert "transformers plain == jaxspec plain: 3 of 3 inputs" in md
