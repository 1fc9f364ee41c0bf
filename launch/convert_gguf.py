r"""Converts a GGUF checkpoint (one file, its parts, or a directory of parts) to a Hugging Face directory.

    python launch/convert_gguf.py --gguf=/work/models/parts/qwen15b --output_dir=/work/models/qwen2.5-coder-1.5b

Writes config.json, model.safetensors (sharded with an index above --max_shard_mb), generation_config.json and
the tokenizer (with the chat template, if the GGUF has one). Quantized tensors are dequantized: the result holds
the quantized model's values, in --dtype. Needs the `gguf` package. A bad flag or a checkpoint error (a missing
part, an --output_dir that is empty, the working directory or a folder that is not a model) ends with one line.
"""

import os
import time

from absl import flags

from jaxspec.cli import flags as cli_flags
from jaxspec.checkpoint.gguf import convert_gguf

_GGUF = flags.DEFINE_string("gguf", None, "A .gguf file, comma-separated parts in order, or a directory of parts "
                            "(joined in natural name order: part2 before part10).", required=True)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "HF directory to write (replaced whole).", required=True)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weight dtype of the safetensors.")
_MAX_SHARD_MB = flags.DEFINE_integer("max_shard_mb", 2000, "Shard the weights above this size (MB).")
_ALWAYS_INDEX = flags.DEFINE_bool("always_index", False, "Write model.safetensors.index.json even for one shard.")
flags.register_validator("output_dir", lambda v: bool(v and v.strip()),
                         message="--output_dir must name a directory (an empty value would be the working directory).")
flags.register_validator("gguf", lambda v: bool(v and v.strip()), message="--gguf must name a GGUF file or directory.")


def main(argv):
  del argv
  start = time.perf_counter()
  out = convert_gguf(_GGUF.value, _OUTPUT_DIR.value, dtype=_DTYPE.value, max_shard_bytes=_MAX_SHARD_MB.value * 10**6,
                     always_index=_ALWAYS_INDEX.value)
  size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)) / 2**20
  print(f"{_GGUF.value} -> {out} ({size:.0f} MiB, {time.perf_counter() - start:.0f} s): {sorted(os.listdir(out))}")


if __name__ == "__main__":
  cli_flags.run(main)
