"""One of two processes x 2 CPU devices (gloo) driving a slot engine in lockstep on a data:2 x model:2 mesh over
both processes' devices: every process makes the same inserts, frees and steps, so every process runs the same
compiled programs, every array of the slot state staying where it was allocated
(tests/serving/test_slot_engine_hosts.py).

    python tests/serving/hosts_worker.py OUT.json PORT PROCESS_ID
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ["JAX_PLATFORMS"] = "cpu"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import jax  # pylint: disable=wrong-import-position

from jaxspec import sharding  # pylint: disable=wrong-import-position


def main(path: str, port: int, process_id: int) -> None:
  sharding.initialize_distributed(f"127.0.0.1:{port}", 2, process_id)
  import jaxspec  # pylint: disable=import-outside-toplevel
  from jaxspec.serving import RequestSettings, SlotEngine  # pylint: disable=import-outside-toplevel
  from engine_helpers import Request, drive, generate_tokens  # pylint: disable=import-outside-toplevel
  from test_slot_engine_drafters import MAX_NEW, PROMPTS, TABLE, _llama  # pylint: disable=import-outside-toplevel
  target, draft = _llama(0), _llama(0, mix=0.07)
  refs = [generate_tokens(target, p, MAX_NEW) for p in PROMPTS]  # one device of this process, no mesh
  engine = SlotEngine(target, jaxspec.Speculation(draft, gamma=2), slots=4, max_input_length=32,
                      max_new_tokens=MAX_NEW, iterations_per_step=3, table=TABLE, modes=("greedy",),
                      mesh=sharding.make_mesh(data=2, model=2))
  def placed():  # every array of the slot state: its sharding's spec and shape
    state = engine._state  # pylint: disable=protected-access
    return [(str(x.sharding.spec), x.shape) for x in jax.tree_util.tree_leaves(state)]

  before = placed()
  requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS)]
  drive(engine, requests)
  leaf = jax.tree_util.tree_leaves(engine._state.target_cache)[0]  # pylint: disable=protected-access
  out = {"process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
         "equal": [r.tokens == ref for r, ref in zip(requests, refs)],
         "local_rows": [s.data.shape[0] for s in leaf.addressable_shards], "rows": leaf.shape[0],
         "specs": sorted({spec for spec, _ in before}), "kept": placed() == before}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(out, f)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
