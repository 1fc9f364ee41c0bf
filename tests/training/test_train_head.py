"""Training EAGLE-3 heads (jaxspec.training.head, head_data, head_steps; launch/train_head.py).

One training run of a tiny random target (train_head_worker.tiny_target: its next token depends mostly on the
current one) is shared by most tests; every later run uses the same shapes and settings, so nothing compiles
twice. The data-parallel run goes to a subprocess (2 simulated CPU devices), started first so that it runs beside
the others.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.errors import ConfigError, InputError
from jaxspec.models import eagle3
from jaxspec.training import head_data, head_steps
from jaxspec.training.head import train_head

import train_head_worker as tiny
from script_helpers import ROOT, assert_one_line_error, run_script

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN, HELD = tiny.prompts(48, 0), tiny.prompts(8, 1)


@pytest.fixture(scope="module", autouse=True)
def mesh_worker(tmp_path_factory):
  """The data-parallel worker, started before the other tests."""
  tmp = tmp_path_factory.mktemp("mesh")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(HERE), HERE]), JAX_PLATFORMS="cpu")
  log = open(tmp / "log.txt", "w")
  proc = subprocess.Popen([sys.executable, os.path.join(HERE, "train_head_worker.py"), str(tmp / "out.json"),
                           str(tmp)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
  yield proc, tmp
  if proc.poll() is None:
    proc.kill()
  log.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """80 steps on 48 prompts, evaluated on 8 held-out prompts at steps 0, 40 and 80."""
  workdir = str(tmp_path_factory.mktemp("head_run"))
  records = []
  result = train_head(tiny.tiny_target(), TRAIN, workdir, tiny.config(eval_every=40), heldout_prompts=HELD,
                      on_log=records.append, name="tiny-head")
  return result, workdir, records


def test_training_lowers_the_loss_and_raises_acceptance(run):
  result, _, records = run
  losses = [r["loss"] for r in result.logs]
  assert [r["step"] for r in result.logs] == list(range(10, 81, 10))
  assert losses[-1] < losses[0] - 0.3, losses
  assert result.logs[-1]["acc_0"] > result.logs[0]["acc_0"] + 0.1
  assert [e["step"] for e in result.evals] == [0, 40, 80]
  untrained, trained = result.evals[0], result.evals[-1]
  assert trained["tokens_per_iteration"] > untrained["tokens_per_iteration"] + 0.15, result.evals
  assert trained["alpha"] > untrained["alpha"] + 0.1
  assert records == sorted(result.logs + result.evals, key=lambda r: (r["step"], r["kind"] == "eval"))


def test_the_draft_vocabulary_is_the_most_frequent_response_tokens():
  data = head_data.HeadData([np.array([9, 9, 1, 2, 2, 3, 2]), np.array([8, 3, 7, 7]), np.array([5, 5])], [2, 1, 2])
  # response tokens: 1, 2, 2, 3, 2 | 3, 7, 7 | (none): counts 2 -> 3, 3 -> 2, 7 -> 2, 1 -> 1
  d2t, t2d = head_data.draft_vocab(data, 10, 3)
  assert np.flatnonzero(t2d).tolist() == [2, 3, 7]  # 1 (seen once) and the prompts' tokens are left out
  assert (np.arange(3) + d2t).tolist() == [2, 3, 7] and d2t.dtype == np.int32 and t2d.dtype == np.bool_
  eagle3.check_vocab_map(d2t, t2d, 10, 3)  # the format jaxspec.load and SpecForge read
  d2t, t2d = head_data.draft_vocab(data, 10, 6)  # 4 distinct tokens: the lowest unused ids fill the rest
  assert np.flatnonzero(t2d).tolist() == [0, 1, 2, 3, 4, 7]
  with pytest.raises(ConfigError, match="draft_vocab_size=11 must be in"):
    head_data.draft_vocab(data, 10, 11)


def test_the_trained_head_maps_and_exports(run):
  """The head's vocabulary is the responses' most frequent tokens; jaxspec.load reads the export back as the same
  head, whose greedy speculative output equals plain decoding."""
  result, workdir, _ = run
  data = head_data.HeadData.load(os.path.join(workdir, "data.json"))
  assert len(data) == len(TRAIN) and [t[:n].tolist() for t, n in zip(data.tokens, data.prompt_lengths)] == TRAIN
  d2t, t2d = head_data.draft_vocab(data, tiny.V, 12)
  np.testing.assert_array_equal(np.asarray(result.head.params["t2d"]), t2d)
  np.testing.assert_array_equal(np.asarray(result.head.params["d2t"]), d2t)
  loaded = jaxspec.load(result.export_dir)
  assert isinstance(loaded, jaxspec.FeatureHead) and loaded.config == result.head.config
  assert "embedding" not in loaded.params  # it embeds with the target's table
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded.params,
               result.head.params)
  target = tiny.tiny_target()
  plain = jaxspec.generate(target, HELD, max_new_tokens=16, max_input_length=16)
  spec = jaxspec.generate(target, HELD, jaxspec.Speculation(loaded, gamma=3), max_new_tokens=16,
                          max_input_length=16)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  assert spec.stats.accepted.sum() > 0 and spec.stats.tokens_per_iteration == pytest.approx(
      result.evals[-1]["tokens_per_iteration"])


def test_the_unroll_is_the_drafter_chain():
  """Step i of the training-time test at index t equals what the head computes at inference after a prefill of
  entries 0..t and i chain steps fed its own pre-norm outputs (eagle3.prefill + eagle3.feed, as HeadDrafter's
  chain calls eagle3.step)."""
  cfg = eagle3.Eagle3Config(vocab_size=16, draft_vocab_size=12, hidden_size=32, target_hidden_size=32,
                            intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8)
  params = head_steps.init_weights(cfg, 0, std=0.3)
  rng = np.random.RandomState(0)
  batch, width, steps = 2, 10, 3
  embed = jnp.asarray(rng.randn(16, 32), jnp.float32)
  features = jnp.asarray(rng.randn(batch, width, 96), jnp.float32)
  tokens = jnp.asarray(rng.randint(0, 16, (batch, width)), jnp.int32)
  head, ts = eagle3.Eagle3Head(cfg), (0, 3, width - steps - 1)

  @jax.jit
  def both():  # one program: the unroll, and for each t the prefill and the chain
    logits, out = head_steps.unroll(params, cfg, embed, features, tokens, steps)
    filled = head.prefill({"head": params, "embed": embed}, eagle3.HeadInput(tokens, head.fuse(params, features)),
                          jnp.full((batch,), width, jnp.int32), 4)
    full, prenorm = filled.cache, filled.features
    chains = []
    for t in ts:
      cache = full.replace(lengths=jnp.full((batch,), t + 1, jnp.int32))  # entries 0..t
      hidden, chain = prenorm[:, t], [prenorm[:, t]]
      for i in range(1, steps):
        pre, cache = eagle3.feed(params, cfg, embed, cache, hidden[:, None], tokens[:, t + 1 + i][:, None])
        hidden = pre[:, 0]
        chain.append(hidden)
      chain = jnp.stack(chain)  # [S, B, H]
      chains.append((chain, eagle3.draft_logits(params, cfg, chain)))
    return logits, out, chains

  logits, out, chains = both()
  for t, (chain, chain_logits) in zip(ts, chains):
    np.testing.assert_allclose(out[:, :, t], chain, atol=1e-4)
    np.testing.assert_allclose(logits[:, :, t], chain_logits, atol=1e-4)
  assert not np.allclose(out[1], out[2], atol=1e-2)  # the steps differ: the check can fail


def test_a_resumed_run_equals_the_uninterrupted_one(run, tmp_path):
  """Stopped after step 30 (its checkpoint written), started again: the same parameters as the run that never
  stopped, bit for bit (the batch order is a function of the step; nothing else is random)."""
  result, workdir, _ = run
  shutil.copy(os.path.join(workdir, "data.json"), tmp_path)  # the same rows, not regenerated
  config = tiny.config(checkpoint_every=15)

  class Killed(Exception):
    pass

  def stop_at_30(record):
    if record["step"] == 30:
      raise Killed

  with pytest.raises(Killed):
    train_head(tiny.tiny_target(), TRAIN, str(tmp_path), config, on_log=stop_at_30)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["15", "30"]
  resumed = train_head(tiny.tiny_target(), TRAIN, str(tmp_path), config)
  assert [r["step"] for r in resumed.logs] == list(range(40, 81, 10))
  assert [r["loss"] for r in resumed.logs] == [r["loss"] for r in result.logs[3:]]
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), resumed.head.params,
               result.head.params)
  with pytest.raises(ConfigError, match="other prompts, settings"):  # a directory of another run
    train_head(tiny.tiny_target(), HELD, str(tmp_path), config)


def test_a_resume_with_another_head_shape_is_refused_before_restoring(run, tmp_path, caplog, capsys):
  """Issue 33 M7: another --draft_vocab_size is refused from the checkpoint's meta, naming the field, before
  regenerating or restoring (Orbax raised a shape error); a changed batch size is reported; Orbax's INFO lines
  stay out of the log."""
  import logging
  _, workdir, _ = run
  for name in ("data.json", "checkpoints"):
    (shutil.copytree if name == "checkpoints" else shutil.copy)(os.path.join(workdir, name), tmp_path / name)
  with pytest.raises(ConfigError, match=r"checkpoints belong to a run with other head .*draft_vocab_size 12 -> 10"):
    train_head(tiny.tiny_target(), TRAIN, str(tmp_path), tiny.config(draft_vocab_size=10))
  capsys.readouterr()
  with caplog.at_level(logging.INFO):  # at step 80 already: restores, reports, exports
    train_head(tiny.tiny_target(), TRAIN, str(tmp_path), tiny.config(batch_size=4, verbose=True))
  assert "batch_size 8 -> 4" in capsys.readouterr().out
  assert not [r for r in caplog.records if r.levelno < logging.WARNING and "orbax" in r.pathname], (
      "Orbax's INFO lines flood the log")


@pytest.mark.parametrize("change, error, needle", [
    (dict(config=dict(draft_vocab_size=17)), ConfigError, r"draft_vocab_size=17 must be in \[1, 16\]"),
    (dict(prompts=[]), InputError, "no prompts to train on"),
    (dict(prompts=[[5, 6], []]), InputError, "prompt 1 is empty"),
    (dict(prompts=[[5, 16]]), InputError, "outside the target's vocabulary"),
    (dict(config=dict(batch_size=64)), ConfigError, "batch_size=64 exceeds the 48 training rows"),
    (dict(target="other"), ConfigError, "needs a decoder-only or a T5 target"),
])
def test_bad_input_is_one_clear_error(run, tmp_path, change, error, needle):
  _, workdir, _ = run
  shutil.copy(os.path.join(workdir, "data.json"), tmp_path)
  target = tiny.tiny_target() if change.get("target") is None else jaxspec.Model(
      types.SimpleNamespace(vocab_size=16), {})  # neither decoder-only nor T5 (T5: test_train_t5_head.py)
  with pytest.raises(error, match=needle):
    train_head(target, change.get("prompts", TRAIN), str(tmp_path), tiny.config(**change.get("config", {})))


def test_launch_script_ends_bad_input_in_one_line(tmp_path):
  """launch/train_head.py: an empty prompts file stops before the target loads, in one line."""
  (tmp_path / "prompts.txt").write_text("\n  \n")
  res = run_script(["launch/train_head.py", "--target=/nonexistent", f"--prompts={tmp_path / 'prompts.txt'}",
                    f"--out={tmp_path / 'out'}"], timeout=120)
  assert_one_line_error(res, "--prompts=", "no prompts (the file is empty or blank)")


def test_data_parallel_on_a_mesh_equals_one_device(mesh_worker):
  """The same run on one device and on a mesh data:2: batches split over the data axis, parameters replicated,
  the same losses and held-out acceptance, parameters equal to float rounding."""
  proc, tmp = mesh_worker
  code = proc.wait(timeout=600)
  assert code == 0, (tmp / "log.txt").read_text()[-4000:]
  out = json.loads((tmp / "out.json").read_text())
  assert out["devices"] == 2 and out["replicated"]
  assert out["batches_one"] == ["one device"] and out["batches_mesh"] == ["P('data',)"]
  np.testing.assert_allclose(out["loss_mesh"], out["loss_one"], rtol=1e-5)
  assert out["evals_mesh"] == out["evals_one"] and len(out["evals_one"]) == 2
  assert out["param_diff"] < 1e-3
