"""Helpers the launch-script tests share: a tiny random T5 pair with the embedded tokenizer (`tiny_pair`), an
EAGLE-3 head for its target (`tiny_head`; `random_head` for any config), `run_script` (a launch script as a
subprocess on CPU; `script_env`, its environment; `run_scripts`, several at once) and `assert_one_line_error`;
`compile_env`, how every JAX subprocess of the tests compiles."""

import atexit
import concurrent.futures
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.models import eagle3, t5
from jaxspec.tokenizer import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
EMBEDDED_TOKENIZER = os.path.join(os.path.dirname(jaxspec.__file__), "embedded", "ende-target")


def tiny_pair(directory) -> tuple[str, str]:
  """A random 1-layer T5 target and draft with the embedded EN-DE tokenizer, saved under directory."""
  tok = load_tokenizer(EMBEDDED_TOKENIZER)
  cfg = t5.T5Config(vocab_size=tok.vocab_size, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                    num_heads=2)
  paths = []
  for name, seed in (("target", 0), ("draft", 1)):
    paths.append(os.path.join(directory, name))
    jaxspec.save(jaxspec.Model(cfg, t5.init_params(cfg, jax.random.key(seed)), tok), paths[-1])
  return paths[0], paths[1]


def random_params(shapes: dict, seed: int) -> dict:
  """N(0, 0.02) weights (norms 1) for a pytree of shapes, drawn by numpy: no compilation."""
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    value = np.ones(shape) if path[-1].key.endswith("norm") else rng.normal(0.0, 0.02, shape)
    return jnp.asarray(value, jnp.float32)
  return jax.tree_util.tree_map_with_path(leaf, shapes, is_leaf=lambda x: isinstance(x, tuple))


def random_head(cfg: eagle3.Eagle3Config, seed: int = 7) -> jaxspec.FeatureHead:
  """A random EAGLE-3 head of `cfg` (its draft vocabulary: every other target id from 0)."""
  d2t, t2d = eagle3.vocab_maps(np.arange(cfg.draft_vocab_size) * 2, cfg.vocab_size)
  params = {**random_params(eagle3.param_shapes(cfg), seed), "d2t": jnp.asarray(d2t), "t2d": jnp.asarray(t2d)}
  return jaxspec.FeatureHead(cfg, params, name="random-head")


def tiny_head(directory, target_hidden_size: int = 16) -> str:
  """A random EAGLE-3 head for `tiny_pair`'s target (the features of its one decoder layer, the embedded
  vocabulary) saved under directory in SpecForge's format; another target_hidden_size: a head that does not fit."""
  cfg = eagle3.Eagle3Config(vocab_size=load_tokenizer(EMBEDDED_TOKENIZER).vocab_size, draft_vocab_size=64,
                            hidden_size=16, target_hidden_size=target_hidden_size, intermediate_size=32, num_heads=2,
                            num_kv_heads=1, head_dim=8, aux_layer_ids=(0, 0, 0))
  jaxspec.save(random_head(cfg), str(directory))
  return str(directory)


# Compilation dominates the tests' JAX subprocesses (launch scripts, sharding workers, notebook kernels) on their
# tiny models, and a test runs a script again and again with the same shapes (a resume, a second training run).
# So they compile for compile time, not for the CPU code's speed: LLVM at -O0 and, where this XLA has them, its
# older fusion emitters (together a third of the default compile time) and each program's LLVM module compiled as
# one part (XLA splits it into up to 32 parts to compile them on threads: on two shared cores that took 2.4x the
# backend compile time of one part with two compiling processes side by side, 1.3x alone; 2026-11-30, the embedded
# pair's generate programs); and the launch scripts and kernels of a session share one persistent compilation cache.
_FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
# And they run single-threaded: two test workers (or a worker and its script) already keep both cores busy, and the
# tiny models' matmuls split over Eigen's threads only wait on each other (the sampling tests alone, one process:
# 94 s against 104 s with Eigen's threads; 2026-11-30).
_ONE_THREAD = ("--xla_cpu_multi_thread_eigen=false",)
# An XLA that does not know a flag aborts: they are tried first (all in one probe, then one at a time if it fails).
_IF_KNOWN = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
# The session's cache (tests/conftest.py's, shared with the in-process tests), or one of our own.
_COMPILATION_CACHE = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tempfile.mkdtemp(
    prefix="jaxspec-test-compilation-cache-")
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
  atexit.register(shutil.rmtree, _COMPILATION_CACHE, ignore_errors=True)


@functools.cache
def xla_test_flags() -> str:
  """XLA_FLAGS for the tests' JAX subprocesses: _FAST_COMPILE, _ONE_THREAD, then each _IF_KNOWN flag that this XLA
  accepts."""
  def known(*tried: str) -> bool:
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, timeout=300,
                           env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(tried)))
    return probe.returncode == 0

  # probed already: tests/conftest.py sets the session's
  untried = [f for f in _IF_KNOWN if f not in os.environ.get("XLA_FLAGS", "").split()]
  accepted = set(untried) if untried and known(*untried) else {f for f in untried if known(f)}
  return " ".join(list(_FAST_COMPILE + _ONE_THREAD) + [f for f in _IF_KNOWN if f not in untried or f in accepted])


def compile_env() -> dict:
  """`xla_test_flags` (after any XLA_FLAGS set) and the session's compilation cache, as environment variables."""
  current = os.environ.get("XLA_FLAGS", "")
  extra = " ".join(f for f in xla_test_flags().split() if f not in current.split())
  return {"XLA_FLAGS": f"{current} {extra}".strip(),
          "JAX_COMPILATION_CACHE_DIR": _COMPILATION_CACHE, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def script_env(**extra: str) -> dict:
  """The environment of a launch script under test: CPU, `compile_env`, then `extra`."""
  return {**os.environ, "JAX_PLATFORMS": "cpu", "TOKENIZERS_PARALLELISM": "false", **compile_env(), **extra}


def run_script(args: list[str], stdin: bytes | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
  """python launch/... on CPU (`script_env`); stdout and stderr as text."""
  env = script_env()
  res = subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, input=stdin, env=env,
                       timeout=timeout)
  return subprocess.CompletedProcess(res.args, res.returncode, res.stdout.decode(errors="replace"),
                                     res.stderr.decode(errors="replace"))


def run_scripts(runs: list, timeout: int = 600) -> list[subprocess.CompletedProcess]:
  """`run_script` for independent runs (each an argument list, or (arguments, stdin)), as many at a time as there
  are CPUs, in order: a short run's time is mostly the interpreter starting and importing JAX, one core's work,
  so three runs or more are forked from one interpreter that imported it once (`run_forked`)."""
  runs = [r if isinstance(r, tuple) else (r, None) for r in runs]
  if len(runs) >= 3:
    return run_forked(runs, timeout=timeout * -(-len(runs) // (os.cpu_count() or 1)))
  with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    return list(pool.map(lambda r: run_script(r[0], r[1], timeout), runs))


def assert_one_line_error(res, *needles: str) -> None:
  """A user error: non-zero exit, no traceback, and the message naming the problem."""
  assert res.returncode != 0, res.stdout[-2000:]
  assert "Traceback" not in res.stderr, res.stderr[-3000:]
  for needle in needles:
    assert needle in res.stderr, (needle, res.stderr[-3000:])


# Launch-script runs forked from one interpreter that has imported what every run imports (JAX,
# jaxspec, transformers' tokenizer: most of a short run's time) and forks a fresh process per run, which runs the
# script as `python launch/translate.py ARGS` does (`runpy`, argv, stdin, stdout and stderr its own, its exit
# status; a traceback printed as the interpreter prints one). JAX's backend starts in each run, after the fork.
_FORKING_RUNNER = r"""
import atexit, json, os, runpy, sys, traceback
spec = json.load(open(sys.argv[1]))
import jaxspec, absl.app, absl.flags
from jaxspec.bench import tune
from jaxspec.cli import flags, jobs, resume
from jaxspec.tokenizer import load_tokenizer
from jaxspec.tools import inputs
load_tokenizer(spec["tokenizer"])  # imports what the first tokenizer load imports
from jax._src import xla_bridge
exec(spec["prelude"])  # the test's own changes, made once for every run (before the backend starts)
assert not xla_bridge.backends_are_initialized(), "forking after JAX started its backend"


def child(run, d):
  fds = [os.open(run["stdin"] or os.devnull, os.O_RDONLY),
         os.open(os.path.join(d, "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
         os.open(os.path.join(d, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)]
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
  sys.argv = list(run["args"])
  sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
  code = 0
  try:
    runpy.run_path(sys.argv[0], run_name="__main__")
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    if not isinstance(e.code, (int, type(None))):
      print(e.code, file=sys.stderr)
  except BaseException:
    traceback.print_exc()
    code = 1
  atexit._run_exitfuncs()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


running, pending = {}, list(enumerate(spec["runs"]))
while pending or running:
  while pending and len(running) < spec["parallel"]:
    i, run = pending.pop(0)
    d = os.path.join(spec["dir"], str(i))
    os.makedirs(d)
    pid = os.fork()
    if pid == 0:
      child(run, d)
    running[pid] = d
  pid, status = os.wait()
  with open(os.path.join(running.pop(pid), "rc"), "w") as f:
    f.write(str(os.waitstatus_to_exitcode(status)))
"""


def run_forked(runs: list, timeout: int = 600, prelude: str = "") -> list[subprocess.CompletedProcess]:
  """`run_scripts`' runs (each an argument list, or (arguments, stdin)) forked from one interpreter
  (_FORKING_RUNNER) with `script_env`, as many at a time as there are CPUs; in order; timeout for them all. For
  many runs of scripts whose imports dominate (`run_scripts`' batches, tests/cli/test_launch_translate.py).
  prelude: Python run in that interpreter before the first fork (e.g. a smaller shape behind a public name)."""
  runs = [r if isinstance(r, tuple) else (r, None) for r in runs]
  with tempfile.TemporaryDirectory(prefix="script-runs-") as d:
    for i, (_, stdin) in enumerate(runs):
      if stdin is not None:
        with open(os.path.join(d, f"stdin{i}"), "wb") as f:
          f.write(stdin)
    spec = {"dir": d, "parallel": os.cpu_count() or 1, "tokenizer": EMBEDDED_TOKENIZER, "prelude": prelude,
            "runs": [{"args": args, "stdin": None if stdin is None else os.path.join(d, f"stdin{i}")}
                     for i, (args, stdin) in enumerate(runs)]}
    with open(os.path.join(d, "spec.json"), "w") as f:
      json.dump(spec, f)
    with subprocess.Popen([sys.executable, "-c", _FORKING_RUNNER, os.path.join(d, "spec.json")], cwd=ROOT,
                          env=script_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, start_new_session=True) as runner:
      try:
        log = runner.communicate(timeout=timeout)[0].decode(errors="replace")
      except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)  # the runner and every run it forked
        raise
    assert runner.returncode == 0, log[-3000:]
    out = []
    for i, (args, _) in enumerate(runs):
      read = lambda name, i=i: open(os.path.join(d, str(i), name), encoding="utf-8", errors="replace").read()
      out.append(subprocess.CompletedProcess(args, int(read("rc")), read("stdout"), read("stderr")))
    return out
