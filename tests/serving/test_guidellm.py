"""guidellm (the vLLM project's serving benchmark), unmodified, benchmarks launch/serve.py on the embedded pair.

guidellm 0.8.1 streams with stream_options {include_usage, continuous_usage_stats}, and for fixed output lengths
sends ignore_eos: true and stop: null (what vLLM reads): every request must succeed and run to its max_tokens, as
guidellm counts from the usage the server reports. guidellm runs from a venv of its own, made once under the user's
cache directory by pip (`_guidellm`), or $JAXSPEC_GUIDELLM names a guidellm executable to use instead. That venv
sees this project's venv behind its own packages (a .pth file): what guidellm needs that the project's venv has in a
version it accepts (torch, transformers, numpy, pydantic) is not installed again, and pip installs the rest, or
another version where guidellm asks for one, in front of it. Made afresh that took 31 s and 340 MB on this project's
2-core AMD machine, against about 150 s and 1.5 GB for a venv of its own with torch (twenty-fourth session). torch is
pinned to the test extra's 2.13.0, whose CPU build the project's machines carry: left to itself pip would take the
newest CUDA build (6 GB) where the project's venv has none.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from jaxspec.bench import serving as bench
from script_helpers import EMBEDDED_TOKENIZER
from serve_helpers import EMBEDDED_SERVER, serve

GUIDELLM = ("guidellm==0.8.1", "torch==2.13.0")  # torch: the CPU build (pyproject's test extra), not CUDA's
REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 6, 8, 12


def _guidellm() -> list[str]:
  """The command that runs guidellm: $JAXSPEC_GUIDELLM, or `python -m guidellm` of its own venv (made once for
  this project's venv, which it sees behind its own packages: the module docstring)."""
  if os.environ.get("JAXSPEC_GUIDELLM"):
    return [os.environ["JAXSPEC_GUIDELLM"]]
  cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxspec-tests"
  behind = sysconfig.get_paths()["purelib"]  # this project's venv's packages: the venv is made for them, by their
  if sys.prefix == sys.base_prefix or not os.path.isdir(behind):  # path and versions; outside a venv (or without
    behind = None  # that folder) one of its own, everything installed
  installed = [] if behind is None else sorted(p for p in os.listdir(behind) if p.endswith(".dist-info"))
  base = "-".join(GUIDELLM).replace("==", "-")
  key = None if behind is None else hashlib.sha256("\n".join([behind, *installed]).encode()).hexdigest()[:12]
  venv = cache / (base if key is None else f"{base}-on-{key}")
  python, complete = venv / "bin" / "python", venv / ".complete"
  own = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
  cache.mkdir(parents=True, exist_ok=True)
  with open(cache / "guidellm.lock", "w", encoding="utf-8") as lock:  # one installer at a time (parallel runs)
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not complete.exists():  # none yet, or a half-made one (an interrupted install): made anew, and those made
      subprocess.run(["rm", "-rf", str(venv)], check=True)  # for other project venvs unused for a day go
      for stale in cache.glob(f"{base}-on-*"):
        if time.time() - stale.stat().st_mtime > 86400:
          subprocess.run(["rm", "-rf", str(stale)], check=True)
      done = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=600,
                            check=False)
      assert done.returncode == 0, f"venv {venv} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
      if behind is not None:
        (own / "zz_jaxspec_project.pth").write_text(behind + "\n", encoding="utf-8")  # after its own packages
      command = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *GUIDELLM]
      done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
      assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
      complete.touch()
    os.utime(venv)  # used now (the folder's time: what the cleanup above reads)
  return [str(python), "-m", "guidellm"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  """(url, the guidellm command): the server compiles while guidellm's venv is checked (or made)."""
  # test_server.py's programs (from the run's compilation cache); guidellm sends no temperature (OpenAI's default,
  # 1: the sampled programs) and prompts of PROMPT_TOKENS, under --max_input_length.
  log = tmp_path_factory.mktemp("serve") / "log.txt"
  with serve(EMBEDDED_SERVER, log, while_compiling=_guidellm) as (url, _, command):
    yield url, command


def test_guidellm_benchmarks_the_server(server, tmp_path):
  url, command = server
  out = tmp_path / "guidellm.json"
  run = subprocess.run(
      [*command, "run", "--backend", f"kind=openai_http,target={url},request_format=/v1/completions",
       "--profile", "kind=concurrent,streams=2", "--constraint", f"kind=max_requests,count={REQUESTS}",
       "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
       "--tokenizer", f"kind=huggingface_auto,model={EMBEDDED_TOKENIZER}", "--output", f"kind=json,path={out}",
       "--disable-console-interactive"],
      cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
      env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
  assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
  benchmark = json.loads(out.read_text())["benchmarks"][0]
  requests, state = benchmark["requests"], benchmark["scheduler_state"]
  # guidellm stops the benchmark once max_requests were created and may leave the last ones (at most one per
  # stream) in flight, uncounted: none may fail.
  assert (requests["errored"], requests["incomplete"], state["errored_requests"]) == ([], [], 0), (
      [r["info"].get("error") for r in requests["errored"]])
  assert REQUESTS - 2 <= len(requests["successful"]) <= REQUESTS
  for r in requests["successful"]:  # ignore_eos: every answer runs to its max_tokens, streamed in pieces
    assert r["output_metrics"]["text_tokens"] == OUTPUT_TOKENS, r["output_metrics"]
    assert r["info"]["timings"]["token_iterations"] > 1
  metrics = bench.scrape(url)
  assert metrics["jaxspec_requests_total{200}"] >= len(requests["successful"])
  assert not [k for k in metrics if k.startswith("jaxspec_requests_total{") and k != "jaxspec_requests_total{200}"]
