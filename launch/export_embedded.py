r"""Copies a trained model into the package as an embedded model (bfloat16 safetensors + tokenizer).

    python launch/export_embedded.py --source=runs/target/export --name=ende-target

Embedded models load by name (`jaxspec.load("ende-target")`), as float32 on CPU. The model is written to a
temporary directory first and swapped in only when complete, so a failed export leaves the old one in place.
"""

import os
import re
import shutil

import jax.numpy as jnp
from absl import flags

import jaxspec
from jaxspec.cli import flags as cli_flags

_SOURCE = flags.DEFINE_string("source", None, "Model directory to embed (e.g. WORKDIR/export from train.py).",
                              required=True)
_NAME = flags.DEFINE_string("name", None, "Embedded model name, e.g. ende-target (letters, digits, '-', '_').",
                            required=True)
flags.register_validator("name", lambda v: bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", v or "")) and
                         v != "samples", message="--name must be letters, digits, '-' or '_' (and not 'samples')")


def main(argv):
  del argv
  model = jaxspec.load(_SOURCE.value, dtype=jnp.float32)
  dest = os.path.join(os.path.dirname(jaxspec.__file__), "embedded", _NAME.value)
  tmp = dest + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  jaxspec.save(model, tmp, format="hf", dtype=jnp.bfloat16)
  shutil.rmtree(dest, ignore_errors=True)
  os.replace(tmp, dest)
  size = sum(os.path.getsize(os.path.join(dest, f)) for f in os.listdir(dest)) / 2**20
  print(f"{model} -> {dest} ({size:.1f} MiB)")


if __name__ == "__main__":
  cli_flags.run(main)
