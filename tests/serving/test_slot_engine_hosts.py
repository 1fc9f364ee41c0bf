"""The slot engine over two processes (issue 38 item 3, its device half): 2 processes x 2 CPU devices on localhost
(gloo), a data:2 x model:2 mesh over both, each process making the same inserts, frees and steps
(tests/serving/hosts_worker.py): every process runs the same compiled programs over its own shards of the slots,
and every request's greedy tokens equal `generate`'s on one device, in both processes; the target's KV heads are
split over `model` and every array stays where it was allocated. (Who decides the steps in a multi-process server,
process 0 through `hosts.Leader`: tests/serving/test_server_hosts.py, test_budget.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jaxspec.serving.server import free_port
from script_helpers import assert_one_line_error, compile_env, run_scripts

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_two_processes_run_the_engine_in_lockstep(tmp_path):
  port = free_port()
  env = dict(os.environ, **compile_env(), PYTHONPATH=os.pathsep.join(
      [os.path.dirname(os.path.dirname(HERE)), os.environ.get("PYTHONPATH", "")]))
  outs = [tmp_path / f"process{i}.json" for i in range(2)]
  procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "hosts_worker.py"), str(out), str(port), str(i)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i, out in enumerate(outs)]
  logs = []
  try:
    for p in procs:
      logs.append(p.communicate(timeout=900)[0].decode(errors="replace"))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
  results = [json.loads(out.read_text()) for out in outs]
  for i, r in enumerate(results):
    assert r["process"] == i and r["processes"] == 2 and r["devices"] == 4, r
    assert r["equal"] == [True] * 6, r
    assert r["rows"] == 4 and r["local_rows"] == [2, 2], r  # each of its devices holds 2 of the 4 slots
    # The target's KV heads over `model`, rows over `data`; the draft model's cache rows over `data` only; inserts
    # and steps (donated) leave every array where it was allocated.
    assert "P('data', None, 'model')" in r["specs"] and "P('data',)" in r["specs"] and r["kept"], r


def test_every_mesh_script_takes_the_process_flags():
  """--coordinator_address, --num_processes, --process_id on the scripts that take --mesh; a process index out of
  range is one line."""
  runs = [[f"launch/{name}.py", "--num_processes=2", "--process_id=2"] for name in ("serve", "generate")]
  for res in run_scripts(runs, timeout=300):
    assert_one_line_error(res, "--process_id=2 is not below --num_processes=2")
