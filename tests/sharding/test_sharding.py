"""Sharded decoding: rules, meshes, placement, loading into shards, the memory plan, and two processes.

Runs that need several devices go to tests/sharding_worker.py subprocesses (8 simulated CPU devices, or 2 processes
x 4 devices over gloo); the 8-device ones start together with the first test, so that they share the 2 cores with
each other and with the in-process tests and launch/plan.py runs before their results are read; tests here compare
what they wrote with one-device runs. Every registered family is decoded on two of the meshes (1, 8), (2, 4),
(4, 2), (8, 1), one mostly over `model` and one mostly over `data`, each of its three modes on one of them; every
mesh decodes every mode (sharding_worker.meshes_of).
"""

from __future__ import annotations

import json
import math
import re
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

import jaxspec
from jaxspec import sharding
from jaxspec.sharding.memory_plan import DEVICE_MEMORY, memory_plan
from jaxspec.models import eagle3, registry
from jaxspec.models.t5 import T5Config

import sharding_worker
from script_helpers import xla_test_flags

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where sharding_worker.py lives
ROOT = os.path.dirname(HERE)
FAMILIES = sorted(f.name for f in registry.families())
# (family, mesh, mode): each family on two meshes, each of its modes on one of them, every mesh by two families and
# in every mode (sharding_worker.meshes_of).
FAMILY_RUNS = [(f, f"{d}x{m}", mode) for f in FAMILIES for (d, m), modes in sharding_worker.meshes_of(f).items()
               for mode in modes]
TIMEOUT = 1800


class Worker:
  """One tests/sharding_worker.py subprocess; `result()` waits for its JSON (or fails with its stderr)."""

  def __init__(self, tmp, name: str, *args: str):
    self.out = os.path.join(tmp, f"{name}.json")
    self.log = open(os.path.join(tmp, f"{name}.log"), "w")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]),
               JAXSPEC_TEST_XLA_FLAGS=xla_test_flags())
    self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "sharding_worker.py"), args[0], self.out,
                                  *args[1:]], stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    self._result = None

  def result(self) -> dict:
    if self._result is None:
      try:
        code = self.proc.wait(timeout=TIMEOUT)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        raise
      self.log.close()
      if code != 0:
        with open(self.log.name) as f:
          pytest.fail(f"sharding worker {self.log.name} exited with {code}:\n{f.read()[-4000:]}")
      with open(self.out) as f:
        self._result = json.load(f)
    return self._result


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
  """The 8-device workers, started at once: the families split over two token runs (their tiny configs written
  here: `configs`), and the program checks."""
  tmp = str(tmp_path_factory.mktemp("sharding"))
  configs = sharding_worker.tiny_config_dicts()
  path = os.path.join(tmp, "configs.json")
  with open(path, "w") as f:
    json.dump(configs, f)
  runs = {"tokens_a": Worker(tmp, "tokens_a", "tokens", path, ",".join(FAMILIES[0::2])),
          "tokens_b": Worker(tmp, "tokens_b", "tokens", path, ",".join(FAMILIES[1::2])),
          "programs": Worker(tmp, "programs", "programs")}
  yield {**runs, "configs": configs}
  for w in runs.values():
    if w.proc.poll() is None:
      w.proc.kill()


def _run_all(cmds: list[list[str]]) -> list[subprocess.CompletedProcess]:
  """Runs the commands side by side (each mostly Python starting and importing JAX: one core's work each)."""
  procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for c in cmds]
  out = []
  for c, p in zip(cmds, procs):
    try:
      stdout, stderr = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    out.append(subprocess.CompletedProcess(c, p.returncode, stdout, stderr))
  return out


def _tokens(workers, family: str) -> dict:
  run = workers["tokens_a" if family in FAMILIES[0::2] else "tokens_b"].result()
  return run[family]


# First (it starts the 8-device workers, which run beside the tests up to "Tokens on every mesh").

def test_every_family_has_a_tiny_config(workers):
  known = set(workers["configs"])
  assert set(FAMILIES) <= known, f"tests/sharding_worker.py has no tiny config for {set(FAMILIES) - known}"
  # Every mesh decodes every mode; every family decodes every mode, each on one of its two meshes.
  meshes = {f"{d}x{m}" for d, m in sharding_worker.MESHES}
  assert {(m, mode) for _, m, mode in FAMILY_RUNS} == {(m, mode) for m in meshes for mode in sharding_worker.MODES}
  assert sorted((f, mode) for f, _, mode in FAMILY_RUNS) == sorted(
      (f, mode) for f in FAMILIES for mode in sharding_worker.MODES)


# Rules and meshes (no devices needed).

def test_rules_split_by_logical_axis_and_replicate_what_the_mesh_does_not_divide():
  mesh = AbstractMesh((2, 4), ("data", "model"))
  rules = sharding.DEFAULT_RULES
  assert sharding.spec_for(("embed", "heads", "kv"), (16, 8, 4), mesh, rules) == (P(None, "model"), [])
  assert sharding.spec_for(("batch", "cache_seq", "heads", "kv"), (6, 9, 8, 4), mesh, rules)[0] == P(
      "data", None, "model")
  spec, notes = sharding.spec_for(("embed", "heads", "kv"), (16, 3, 4), mesh, rules)
  assert spec == P() and notes == ["heads=3 is not divisible by model=4: replicated"]
  assert sharding.spec_for(("vocab", "embed"), (96, 16), mesh, sharding.resolve_rules({"vocab": None}))[0] == P()
  # A mesh axis splits at most one dimension of an array; size-1 axes split nothing.
  assert sharding.spec_for(("mlp", "vocab"), (8, 8), mesh, rules)[0] == P("model")
  assert sharding.spec_for(("batch",), (6,), AbstractMesh((1, 8), ("data", "model")), rules)[0] == P()
  assert sharding.local_shape((6, 9, 8, 4), P("data", None, "model"), mesh) == (3, 9, 2, 4)
  with pytest.raises(ValueError, match="rules"):
    sharding.resolve_rules([("heads", 3)])


def test_make_mesh_fills_the_devices_and_names_bad_sizes():
  n = jax.device_count()
  assert dict(sharding.make_mesh().shape) == {"data": 1, "model": n}
  assert dict(sharding.make_mesh(data=n).shape) == {"data": n, "model": 1}
  with pytest.raises(ValueError, match="data=2 x model=3"):
    sharding.make_mesh(data=2, model=3)
  with pytest.raises(ValueError, match="model must be an integer"):
    sharding.make_mesh(model=0)
  assert sharding.parse_mesh("data:2, model:4") == {"data": 2, "model": 4}
  assert sharding.mesh_from_flag("") is None
  for bad in ("data:0", "rows:2", "data:2,data:2", "model:x"):
    with pytest.raises(ValueError, match="mesh"):
      sharding.parse_mesh(bad)
  assert sharding.is_main_process() and not sharding.initialize_distributed()


def _t5_11b_params() -> int:
  """T5-11B's parameter count, from its published shapes (independent of jaxspec's tables)."""
  d, kv, ff, heads, layers, vocab = 1024, 128, 65536, 128, 24, 32128
  attention = 4 * d * heads * kv
  return vocab * d + layers * (attention + 2 * d * ff + 2 * d) + layers * (2 * attention + 2 * d * ff + 3 * d) + (
      2 * 32 * heads + 2 * d)


def test_memory_plan_of_t5_11b_on_8_devices_matches_its_shapes():
  plan = memory_plan("t5-11b", (1, 8), batch=32, max_input_length=128, max_new_tokens=128, gamma=7,
                     dtype="bfloat16", draft="t5-small")
  target = plan.models[0]
  replicated = 24 * 2 * 1024 + 24 * 3 * 1024 + 2 * 1024  # Norm scales: "embed" only.
  assert target.params == 2 * ((_t5_11b_params() - replicated) // 8 + replicated)
  cache_len = 128 + 7 + 1
  kv = 2 * 24 * 32 * (cache_len + 128) * 128 * 128 * 2 // 8  # Self and cross K, V with heads over 8 devices.
  assert kv <= target.caches <= kv + 32 * 128 + 2 * 32 * 4  # + the encoder mask and the per-row lengths.
  assert plan.models[1].params == 2 * 60_506_624  # t5-small (tied), replicated over `model`.
  assert plan.fits(DEVICE_MEMORY["tpu-v5e"]) and not plan.fits(DEVICE_MEMORY["tpu-v2"] // 2)
  assert 0 < plan.activations < plan.params
  one = memory_plan("t5-11b", (1, 1), 1, 128, 128, 7, "bfloat16", draft="t5-small")
  assert one.params > 22e9 and one.fits(DEVICE_MEMORY["h100-80gb"]) and not one.fits(DEVICE_MEMORY["tpu-v5e"])


def test_memory_plan_says_what_it_replicated_and_pads_the_batch():
  cfg = T5Config(vocab_size=96, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=3)
  plan = memory_plan(cfg, {"data": 2, "model": 4}, batch=5, max_input_length=16, max_new_tokens=8, gamma=2,
                     dtype=jnp.float32, draft=cfg)
  assert plan.batch == 6
  assert any("heads=3 is not divisible by model=4" in n for n in plan.notes)
  assert "note:" in plan.table()


def test_memory_plan_caches_of_any_batch_are_those_its_prefill_makes():
  """The plan traces one row's prefill and sets each cache array's "batch" axis to the batch (`_cache_shapes`):
  for every family, the caches a prefill of 3 rows makes; a batch axis named wrong would be caught."""
  from jaxspec.sharding import memory_plan as plan_module
  for name, config in sharding_worker.tiny_configs(sharding_worker.tiny_config_dicts()).items():
    dtype = jnp.dtype(jnp.float32)
    _, (traced, _) = plan_module._traced_prefill(config, dtype, 3, 16, 12)  # pylint: disable=protected-access
    scaled = plan_module._cache_shapes(config, dtype, 3, 16, 12)  # pylint: disable=protected-access
    assert jax.tree.structure(scaled) == jax.tree.structure(traced), name
    assert [(x.shape, x.dtype) for x in jax.tree.leaves(scaled)] == [
        (x.shape, x.dtype) for x in jax.tree.leaves(traced)], name
    assert any(3 in x.shape for x in jax.tree.leaves(scaled)), name


def test_plan_script_says_whether_it_fits():
  cmd = [sys.executable, os.path.join(ROOT, "launch", "plan.py"), "--model=t5-11b", "--draft=t5-small",
         "--mesh=data:1,model:8", "--batch=32", "--device=tpu-v5e"]
  out, small = _run_all([cmd, cmd[:-1] + ["--device_gib=1"]])
  assert out.returncode == 0, out.stderr[-2000:]
  assert "fits" in out.stdout and "tpu-v5e" in out.stdout
  assert small.returncode == 0 and "does not fit" in small.stdout


def test_plan_script_plans_a_server():
  """--slots: the slot engine's memory per device and the most slots that fit at these lengths (a multiple of
  `data`); fewer fit a smaller device; a data axis that does not divide --slots is one line."""
  cmd = [sys.executable, os.path.join(ROOT, "launch", "plan.py"), "--model=t5-11b", "--draft=t5-small",
         "--mesh=data:2,model:4", "--device=tpu-v5e-8", "--slots=64"]
  runs = [cmd, cmd + ["--device_gib=8"], cmd[:-1] + ["--slots=3"]]
  big, small, odd = _run_all(runs)
  assert big.returncode == 0 and small.returncode == 0, (big.stderr[-2000:], small.stderr[-2000:])
  most = [int(re.search(r"at most (\d+) slots fit at these lengths", r.stdout).group(1)) for r in (big, small)]
  assert "serving plan: 64 slots" in big.stdout and "fits on tpu-v5e" in big.stdout, big.stdout
  assert "does not fit on 8 GiB devices" in small.stdout, small.stdout
  assert most[0] >= 64 > most[1] and most[0] % 2 == 0 == most[1] % 2, most
  assert odd.returncode == 1 and "Traceback" not in odd.stderr
  assert "--slots=3 is not a multiple of the mesh's data axis (2)" in odd.stderr, odd.stderr[-2000:]


def test_a_draft_on_a_mesh_needs_its_target_there_too():
  cfg = T5Config(vocab_size=96, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)
  target, draft = sharding_worker.pair(cfg)
  mesh = sharding.make_mesh(1, 1, devices=jax.devices()[:1])
  placed = sharding.shard(draft, mesh)
  assert sharding.mesh_of(placed.params) == mesh and sharding.mesh_of(draft.params) is None
  assert dict(sharding.rules_of(placed))["heads"] is None  # Size-1 axes split nothing.
  with pytest.raises(ValueError, match="target is not"):
    jaxspec.generate(target, [[5, 6]], jaxspec.Speculation(placed), max_new_tokens=4)


# Tokens on every mesh, every family (8 simulated devices).

@pytest.mark.slow
@pytest.mark.parametrize("family,mesh,mode", FAMILY_RUNS)
def test_same_tokens_and_stats_on_every_mesh(workers, family, mesh, mode):
  runs = _tokens(workers, family)[mode]
  ref, got = runs["reference"], runs[mesh]
  assert len(set(np.ravel(ref["tokens"]).tolist())) > 3, "degenerate reference: the comparison would be weak"
  assert len(got["tokens"]) == 5  # Padding rows (to a multiple of data) are dropped.
  for field in ("tokens", "lengths", "iterations", "accepted", "drafted"):
    assert got[field] == ref[field], field
  np.testing.assert_allclose(got["beta_sum"], ref["beta_sum"], rtol=1e-5)


# The compiled programs (8 simulated devices).

def test_no_weight_is_gathered_inside_the_loop(workers):
  run = workers["programs"].result()
  assert run["while_loops"] >= 1
  weights = set(run["weight_sizes"])
  gathered = [(line, n) for line, n in run["all_gathers"] if n in weights]
  assert not gathered, f"all-gathers of sharded weights inside the loop: {gathered}"
  # The detector sees a weight gathered inside a while body when there is one.
  assert any(n == run["control_size"] for _, n in run["control_all_gathers"])


def test_caches_stay_sharded_through_the_loop(workers):
  run = workers["programs"].result()
  want = {"batch": "data", "heads": "model"}  # The target's 4 heads divide model=4; batch 6 divides data=2.
  for axes, spec in run["cache_in"]:
    assert spec == [want.get(a) for a in axes], (axes, spec)
  assert run["cache_out"] == run["cache_in"] and run["donated"]
  for axes, spec in run["draft_cache_in"]:  # The draft is replicated over `model`: only its batch is split.
    assert spec == ["data" if a == "batch" else None for a in axes], (axes, spec)
  assert "P(None, 'model')" in run["param_specs_in"]


def test_one_by_one_mesh_decodes_as_one_device(workers):
  family, modes = sharding_worker.ONE_BY_ONE
  runs = _tokens(workers, family)
  for mode in modes:  # The sharded path on data=1 x model=1 against the unsharded one: every field, exactly.
    assert runs[mode]["1x1"] == runs[mode]["reference"], mode


def test_memory_plan_against_xla_memory_analysis(workers):
  run = workers["programs"].result()
  plan, xla = run["plan"], run["xla"]
  assert plan["batch"] == 6
  assert plan["params"] == xla["params"]
  assert plan["caches"] == xla["loop_alias"]  # The donated caches are what the loop aliases.
  assert abs(plan["caches"] - xla["prefill_out"]) <= 0.02 * plan["caches"]
  temp = max(xla["loop_temp"], xla["prefill_temp"])
  assert 0.5 * temp <= plan["activations"] <= 2 * temp
  peak = xla["params"] + xla["loop_out"] + xla["loop_temp"]
  assert abs(plan["total"] - peak) <= 0.25 * peak


def test_loading_into_shards(workers):
  run = workers["programs"].result()
  assert run["orbax_equal"] and run["orbax_same_sharding"]
  assert run["hf_equal"] and run["hf_same_sharding"]


# Two processes x 4 devices (gloo).

@pytest.fixture(scope="module")
def distributed(tmp_path_factory, workers):
  tmp = str(tmp_path_factory.mktemp("distributed"))
  cfg = T5Config(vocab_size=128, d_model=16, d_kv=4, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=8,
                 relative_attention_num_buckets=8, relative_attention_max_distance=20, tie_word_embeddings=False,
                 scale_decoder_outputs=False)
  target, draft = sharding_worker.pair(cfg)
  head_config = eagle3.Eagle3Config(vocab_size=128, draft_vocab_size=64, hidden_size=16, target_hidden_size=16,
                                    intermediate_size=32, num_heads=2, num_kv_heads=1, head_dim=8,
                                    aux_layer_ids=(0, 0, 0))
  head = jaxspec.FeatureHead(head_config, eagle3.init_params(head_config, jax.random.PRNGKey(3), std=0.2))
  dirs = [os.path.join(tmp, n) for n in ("target", "draft", "head")]
  for model, d in zip((target, draft), dirs):
    jaxspec.save(model, d, format="hf")
  jaxspec.save(head, dirs[2])
  for name in ("tokens_a", "tokens_b", "programs"):  # Two more processes: wait for the 8-device runs to end.
    workers[name].result()
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = [Worker(tmp, f"process{i}", "distributed", ",".join(dirs), str(port), str(i)) for i in range(2)]
  rows = sharding_worker.prompts(cfg.vocab_size)
  target, draft = (jaxspec.load(d, dtype=jnp.float32) for d in dirs[:2])
  head = jaxspec.load(dirs[2])
  kw = sharding_worker.KW
  reference = {"greedy": jaxspec.generate(target, rows, jaxspec.Speculation(draft, gamma=sharding_worker.GAMMA),
                                          **kw).tokens.tolist(),
               "head_sampled": jaxspec.generate(target, rows, jaxspec.Speculation(head, gamma=sharding_worker.GAMMA),
                                                jaxspec.Sampling(temperature=1.0), seed=[1, 2, 3, 4, 5],
                                                **kw).tokens.tolist()}
  for tokens in reference.values():
    assert len(set(np.ravel(tokens).tolist())) > 3, "degenerate reference: the comparison would be weak"
  return [p.result() for p in procs], reference


@pytest.mark.slow
def test_two_processes_give_the_same_tokens(distributed):
  results, reference = distributed
  assert [r["process"] for r in results] == [0, 1] and all(r["devices"] == 8 and r["local"] == 4 for r in results)
  assert [r["main"] for r in results] == [True, False]
  for r in results:
    assert r["greedy"] == reference["greedy"]  # A draft model, on model=8.
    # A feature head on the mesh (its weights replicated there by generate) gives one device's sampled tokens.
    assert r["head_sampled"] == reference["head_sampled"]
    assert r["head_replicated"]


@pytest.mark.slow
def test_each_process_reads_only_its_slices(distributed):
  results, _ = distributed
  total = results[0]["bytes_total"]
  for r in results:  # model=8 over 2 processes: half of every split weight, all of the (small) replicated ones.
    assert 0.4 * total < r["bytes_read"] < 0.6 * total
  assert math.isclose(results[0]["bytes_read"], results[1]["bytes_read"], rel_tol=0.01)
