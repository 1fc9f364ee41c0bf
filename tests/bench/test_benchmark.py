"""Cheap regression guards for launch/benchmark.py and launch/loop_profile.py: tiny runs, valid JSON and plot.

No timing is asserted: timings belong to the benchmark's reports, not to tests.
"""

import json

import pytest

from conftest import write_hf_t5
from script_helpers import run_forked


# t5-small's name (its paper row: alpha 0.75, and so the loop run) on a 1-layer shape of width 32: the
# script's whole path at a fraction of the real shape's compile and run time (64 s of CPU on the 2-core machine).
TINY_T5_SMALL = ("from jaxspec.models.t5.shapes import T5_SHAPES\n"
                 "T5_SHAPES['t5-small'] = dict(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, "
                 "num_heads=4)\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The three smoke runs, forked together from one interpreter that imported JAX and jaxspec once (`run_forked`,
  as many at a time as there are CPUs; its prelude, TINY_T5_SMALL, is for hardware_costs.py: benchmark.py reads its
  models from the directories written here and loop_profile.py uses the embedded pair, neither a T5 shape name).
  {script: (CompletedProcess, its directory)}."""
  tmp = {name: tmp_path_factory.mktemp(name) for name in ("benchmark", "hardware_costs", "loop_profile")}
  bench = tmp["benchmark"]
  write_hf_t5(str(bench / "target"), "t5_v1_1", d_model=32)
  write_hf_t5(str(bench / "draft"), "t5_v1_0", seed=1)
  inputs = bench / "in.txt"
  inputs.write_text("\n".join(" ".join(str(5 + (i * j) % 80) for j in range(6)) for i in range(3)))
  # The tiny checkpoints have no tokenizer: the input file holds token ids.
  args = {"benchmark": ["launch/benchmark.py", f"--target={bench / 'target'}", f"--draft={bench / 'draft'}",
                        f"--input={inputs}", "--input_is_token_ids", "--gammas=2", "--temperatures=0,1",
                        "--batch_sizes=1", "--sentences=3", "--repeats=1", "--max_new_tokens=6",
                        f"--output_dir={bench / 'bench'}"],
          "hardware_costs": ["launch/hardware_costs.py", "--target=t5-small", "--drafts=t5-small", "--gammas=2",
                             "--batch_sizes=1", "--dtype=float32", "--repeats=1",
                             f"--output={tmp['hardware_costs'] / 'costs'}"],
          "loop_profile": ["launch/loop_profile.py", "--gammas=2", "--sentences=2", "--rounds=1",
                           "--max_new_tokens=8", f"--output={tmp['loop_profile'] / 'profile'}"]}
  results = run_forked(list(args.values()), timeout=900, prelude=TINY_T5_SMALL)
  return {name: (res, tmp[name]) for name, res in zip(args, results)}


def test_benchmark_smoke_run(runs):
  res, tmp_path = runs["benchmark"]
  out = tmp_path / "bench"
  assert res.returncode == 0, res.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  assert len(results["jaxspec"]) == 2
  for row in results["jaxspec"]:
    for key in ("alpha", "tokens_per_iteration", "c", "r", "plain_ms_per_token", "spec_ms_per_token", "speedup",
                "expected_speedup", "expected_speedup_with_r", "measured_over_expected",
                "measured_over_cost_model", "c_alternating", "measured_over_expected_alternating",
                "expected_speedup_workload", "measured_over_expected_workload"):
      assert isinstance(row[key], float) and row[key] == row[key], key  # a real number, not NaN
    assert len(row["acceptance_per_position"]) == row["gamma"]
    if row["temperature"] == 0:
      assert row["identical_to_plain"] is True
  assert [r["gamma"] for r in results["transformers"]] == [2]
  assert (out / "speedup.png").stat().st_size > 0
  assert "| Temp | Batch | gamma |" in (out / "results.md").read_text()


def test_hardware_costs_smoke_run(runs):
  """launch/hardware_costs.py with t5-small's name on a tiny shape (random weights): valid ratios, loop timings."""
  res, tmp_path = runs["hardware_costs"]
  assert res.returncode == 0, res.stderr[-3000:]
  results = json.loads((tmp_path / "costs.json").read_text())
  (row,) = results["rows"]
  assert row["gamma"] == 2 and row["paper_alpha"] == 0.75
  for key in ("c", "r", "expected", "expected_r1", "target_step_s", "draft_step_s"):
    assert row[key] > 0, key
  (loop,) = results["loop"]
  assert 1 <= loop["plain"]["tokens"] == loop["plain"]["iterations"] <= 64  # plain: one token per step
  assert loop["speculative"]["iterations"] <= loop["speculative"]["tokens"] <= 64
  assert loop["speculative"]["ms_per_iteration"] > 0 and loop["model_ms_speculative"] > 0
  header = next(line for line in (tmp_path / "costs.md").read_text().splitlines() if line.startswith("| "))
  assert [c.strip() for c in header.strip("|").split("|")][:3] == ["batch", "draft", "gamma"]


def test_loop_profile_smoke_run(runs):
  res, tmp_path = runs["loop_profile"]
  assert res.returncode == 0, res.stderr[-3000:]
  rows = json.loads((tmp_path / "profile.json").read_text())["rows"]
  assert [r["gamma"] for r in rows] == [0, 2]
  for row in rows:
    assert row["unmapped_instructions"] == []
    parts = row["ms_per_iteration"]
    assert sum(parts[c] for c in ("target", "draft", "loop", "idle")) == pytest.approx(parts["wall"], rel=1e-6)
  assert rows[1]["c_in_loop"] > 0 and rows[1]["r_in_loop"] > 0
  assert (tmp_path / "profile.md").read_text().count("\n| ") >= 2
