"""Helpers the launch-script tests share: a tiny random T5 pair with the embedded tokenizer (`tiny_pair`),
`run_script` (a launch script as a subprocess on CPU) and `assert_one_line_error`."""

import os
import subprocess
import sys

import jax

import jaxspec
from jaxspec.models import t5
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


def run_script(args: list[str], stdin: bytes | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
  """python launch/... on CPU; stdout and stderr as text."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
  res = subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, input=stdin, env=env,
                       timeout=timeout)
  return subprocess.CompletedProcess(res.args, res.returncode, res.stdout.decode(errors="replace"),
                                     res.stderr.decode(errors="replace"))


def assert_one_line_error(res, *needles: str) -> None:
  """A user error: non-zero exit, no traceback, and the message naming the problem."""
  assert res.returncode != 0, res.stdout[-2000:]
  assert "Traceback" not in res.stderr, res.stderr[-3000:]
  for needle in needles:
    assert needle in res.stderr, (needle, res.stderr[-3000:])
