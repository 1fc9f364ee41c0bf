"""The slot engine on a mesh of 2 simulated CPU devices (a subprocess: the device count is fixed before JAX
starts): a target sharded over `model` (heads) with a draft model replicated, as `generate` places them, decodes
every request to `generate`'s unsharded plain greedy tokens, requests joining and leaving."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = r"""
import json, sys
import jax, jaxspec
from jaxspec.serving import RequestSettings, SlotEngine
from test_slot_engine_drafters import MAX_NEW, PROMPTS, _llama
from engine_helpers import Request, drive, generate_tokens
assert len(jax.devices()) == 2
target, draft = _llama(0), _llama(0, mix=0.07)
refs = [generate_tokens(target, p, MAX_NEW) for p in PROMPTS[:4]]
engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=2), slots=2, max_input_length=16,
                    max_new_tokens=MAX_NEW, iterations_per_step=3, mesh=jaxspec.make_mesh(model=2))
requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS[:4])]
drive(engine, requests)
leaf = jax.tree_util.tree_leaves(engine.target_params)[0]
print(json.dumps({"equal": [r.tokens == ref for r, ref in zip(requests, refs)],
                  "devices": len(leaf.sharding.device_set), "mesh": dict(engine.mesh.shape)}))
"""


@pytest.mark.slow
def test_engine_on_a_two_device_mesh_equals_plain_greedy():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE),
                                                                          os.environ.get("PYTHONPATH", "")]),
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, env=env, cwd=HERE)
  assert run.returncode == 0, run.stderr[-3000:]
  out = json.loads(run.stdout.strip().splitlines()[-1])
  assert out["equal"] == [True] * 4 and out["devices"] == 2 and out["mesh"] == {"data": 1, "model": 2}, out
