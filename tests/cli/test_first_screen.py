"""What a launch script shows before the user's output (issue 40 item 15) and how it names a bad flag value (item
13: --gamma=auto and int()'s words).

JAX's "Unable to initialize backend 'tpu'" INFO line (JAX probing for accelerators when JAX_PLATFORMS is not set)
and transformers' "PyTorch was not found" warning (transformers imported for a tokenizer on a machine without
PyTorch) came before any German; `jaxspec.cli.flags.quiet_startup` drops those two records by logger, level and
text, and nothing else."""

import logging
import subprocess
import sys

import pytest

from jaxspec.cli import flags as cli_flags
from script_helpers import ROOT, assert_one_line_error, run_scripts, script_env, tiny_pair

# Runs a script as on a machine without PyTorch: transformers' find_spec("torch") finds nothing.
WITHOUT_TORCH = ("import importlib.util as u, runpy, sys; f = u.find_spec; "
                 "u.find_spec = lambda n, *a, **k: None if n.split('.')[0] == 'torch' else f(n, *a, **k); "
                 "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def test_translate_first_screen_is_the_translation(tmp_path):
  target, draft = tiny_pair(str(tmp_path))
  env = {k: v for k, v in script_env().items() if k != "JAX_PLATFORMS"}  # JAX probes its backends, as for a user
  res = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, "launch/translate.py", "--input=-", "--nocompare",
                        f"--target={target}", f"--draft={draft}", "--max_new_tokens=3"], cwd=ROOT, env=env,
                       input=b"Hello.\n", capture_output=True, timeout=600)
  out, err = res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace")
  assert res.returncode == 0, err[-3000:]
  assert "  -> " in out
  for noise in ("Unable to initialize backend", "PyTorch was not found"):
    assert noise not in err, err[-3000:]


@pytest.fixture
def records():
  """The records that reach a handler of the root logger after quiet_startup."""
  cli_flags.quiet_startup()
  cli_flags.quiet_startup()  # twice: one filter per logger
  seen = []

  class Keep(logging.Handler):
    def emit(self, record):
      seen.append((record.name, record.levelno, record.getMessage()))
  handler, root = Keep(logging.DEBUG), logging.getLogger()
  old_level = root.level
  root.addHandler(handler)
  root.setLevel(logging.DEBUG)
  yield seen
  root.removeHandler(handler)
  root.setLevel(old_level)


def test_only_the_two_startup_lines_are_dropped(records):
  jax_log, hf_log = logging.getLogger("jax._src.xla_bridge"), logging.getLogger("transformers")
  assert sum(isinstance(f, cli_flags._DropStartupNoise) for f in jax_log.filters) == 1  # pylint: disable=protected-access
  propagate = hf_log.propagate
  hf_log.propagate = True  # transformers' own handler may be set already; here its records reach the root
  try:
    jax_log.info("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
    jax_log.warning("Unable to initialize backend 'cuda': a GPU is present but its plugin failed")  # a real one
    jax_log.warning("An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed.")
    hf_log.warning("PyTorch was not found. Models won't be available.")
    hf_log.warning("Token indices sequence length is longer than the specified maximum")
    logging.getLogger("jax._src.other").info("Unable to initialize backend 'tpu'")  # another logger: kept
  finally:
    hf_log.propagate = propagate
  assert [m for _, _, m in records] == [
      "Unable to initialize backend 'cuda': a GPU is present but its plugin failed",
      "An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed.",
      "Token indices sequence length is longer than the specified maximum",
      "Unable to initialize backend 'tpu'"]


def test_bad_flag_values_are_named_not_int_errors():
  cases = [(["launch/serve.py", "--gamma=auto"], ("--gamma=auto", "integer >= 1", "translate.py")),
           (["launch/evaluate.py", "--gamma=auto"], ("--gamma=auto", "integer >= 1")),
           (["launch/serve.py", "--slots=x"], ("--slots=x: expected an integer, got 'x'",)),
           (["launch/serve_benchmark.py", "--timeout=x"], ("--timeout=x: expected a number, got 'x'",))]
  for (_, needles), res in zip(cases, run_scripts([a for a, _ in cases], timeout=300)):
    assert_one_line_error(res, *needles)
    assert "invalid literal" not in res.stderr and "could not convert" not in res.stderr
