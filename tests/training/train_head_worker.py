"""The tiny target and run settings of tests/training/test_train_head.py, and the subprocess side of its
data-parallel test (2 simulated CPU devices: the device count is fixed before JAX starts, hence a subprocess).

    python tests/training/train_head_worker.py OUT.json WORKDIR

trains the same head on one device and on a mesh data:2 (batch split over the two devices, parameters
replicated) and writes both runs' losses, acceptance and parameters' largest difference as JSON.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys

if __name__ == "__main__":  # Before JAX starts; the test module imports the helpers below without this.
  # The session's compile-time flags (tests/conftest.py's: script_helpers.xla_test_flags), or -O0 run alone.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS") or "--xla_backend_optimization_level=0 "
                             "--xla_llvm_disable_expensive_passes=true") + " --xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxspec  # noqa: E402
from jaxspec.models import decoder_only as do  # noqa: E402
from jaxspec.models.decoder_only.llama import LlamaConfig  # noqa: E402
from jaxspec.training.head import HeadTrainConfig  # noqa: E402

V = 16  # the target's vocabulary
EOS = 4


@functools.lru_cache(maxsize=None)
def tiny_target(mix: float = 0.05) -> jaxspec.Model:
  """A random 4-layer Llama whose layers write little into the residual stream, so that its next token depends
  mostly on the current one (a map a one-layer head can learn two steps of). Weights drawn with numpy (N(0, 1),
  norms the identity): jax.random would compile a program per shape."""
  cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                    head_dim=8, eos_ids=(EOS,), pad_token_id=0, bos_token_id=None)
  rng = np.random.default_rng(0)
  p = jax.tree.map(lambda shape: rng.normal(size=shape).astype(np.float32), do.param_shapes(cfg),
                   is_leaf=lambda x: isinstance(x, tuple))
  p["final_norm"] = np.ones_like(p["final_norm"])
  for layer in p["layers"]:
    layer["attention_norm"], layer["mlp_norm"] = np.ones_like(layer["attention_norm"]), np.ones_like(layer["mlp_norm"])
    layer["attention"]["o"] *= mix / 4
    layer["mlp"]["down"] *= mix / 8
  return jaxspec.Model(cfg, jax.tree.map(jnp.asarray, p), name="tiny-llama")


def prompts(n: int, seed: int) -> list[list[int]]:
  rng = np.random.RandomState(seed)
  return [rng.randint(5, V, size=rng.randint(2, 8)).tolist() for _ in range(n)]


def config(**overrides) -> HeadTrainConfig:
  """Small runs: responses of at most 16 tokens; evaluations decode as many tokens with as many rows per call as
  the regeneration, so both reuse one compiled prompt bucket."""
  kw = dict(steps=80, batch_size=8, learning_rate=3e-3, draft_vocab_size=12, ttt_steps=3, max_new_tokens=16,
            max_input_length=16, generate_batch_size=8, eval_every=0, eval_max_new_tokens=16, checkpoint_every=0,
            log_every=10, progress=False, verbose=False)
  return HeadTrainConfig(**{**kw, **overrides})


def main(out: str, workdir: str) -> None:
  from unittest import mock
  from jaxspec.training import head_steps
  from jaxspec.training.head import train_head
  seen = []  # the sharding of every batch the train step gets
  step = head_steps.train_step

  def recording_step(settings, params, opt_state, embed, batch):
    seen.append(str(getattr(batch.features.sharding, "spec", "one device")))
    return step(settings, params, opt_state, embed, batch)

  target = tiny_target()
  train, held = prompts(32, 0), prompts(8, 1)
  cfg = config(steps=12, log_every=4)
  one, two = os.path.join(workdir, "one"), os.path.join(workdir, "mesh")
  with mock.patch.object(head_steps, "train_step", recording_step):
    single = train_head(target, train, one, cfg, heldout_prompts=held)
    seen_one, seen[:] = sorted(set(seen)), []
    os.makedirs(two, exist_ok=True)
    shutil.copy(os.path.join(one, "data.json"), two)  # the same rows, not regenerated on the mesh
    placed = train_head(target, train, two, cfg, heldout_prompts=held, mesh=jaxspec.make_mesh(data=2))
  leaves = jax.tree.leaves(placed.head.params)
  diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
             for a, b in zip(jax.tree.leaves(single.head.params), leaves))
  result = {"devices": len(jax.devices()), "loss_one": [r["loss"] for r in single.logs],
            "loss_mesh": [r["loss"] for r in placed.logs], "evals_one": single.evals, "evals_mesh": placed.evals,
            "param_diff": diff, "batches_one": seen_one, "batches_mesh": sorted(set(seen)),
            "replicated": all(x.sharding.is_fully_replicated and len(x.sharding.device_set) == 2 for x in leaves)}
  with open(out, "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
