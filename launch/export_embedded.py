r"""Copies a trained model into the package as an embedded model (bfloat16 safetensors + tokenizer).

    python launch/export_embedded.py --source=/tmp/work/target/export --name=ende-target

Embedded models load by name (`jaxspec.load("ende-target")`), as float32 on CPU.
"""

import os
import shutil

import jax.numpy as jnp
from absl import app, flags

import jaxspec

_SOURCE = flags.DEFINE_string("source", None, "Model directory to embed (e.g. WORKDIR/export from train.py).",
                              required=True)
_NAME = flags.DEFINE_string("name", None, "Embedded model name, e.g. ende-target.", required=True)


def main(argv):
  del argv
  model = jaxspec.load(_SOURCE.value, dtype=jnp.float32)
  dest = os.path.join(os.path.dirname(jaxspec.__file__), "embedded", _NAME.value)
  if os.path.exists(dest):
    shutil.rmtree(dest)
  jaxspec.save(model, dest, format="hf", dtype=jnp.bfloat16)
  size = sum(os.path.getsize(os.path.join(dest, f)) for f in os.listdir(dest)) / 2**20
  print(f"{model} -> {dest} ({size:.1f} MiB)")


if __name__ == "__main__":
  app.run(main)
