"""The mapping between Hugging Face T5 tensor names and jaxspec's parameter pytree.

One table row per tensor: our path, the HF name, and a layout hook. HF stores `nn.Linear` weights as
[out, in]; we store [in, out] with heads split out ([D, N, H] for q/k/v, [N, H, D] for o), so each row
says which of four layouts applies and the hooks convert both ways. A test checks that the table covers
every tensor transformers writes for each T5 family, so no weight is silently missing or unused.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxspec.models.t5.config import T5Config


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one tensor is laid out in HF versus jaxspec."""

  name: str
  to_ours: Callable[[np.ndarray, T5Config], np.ndarray]
  to_hf: Callable[[np.ndarray, T5Config], np.ndarray]


AS_IS = Layout("as_is", lambda a, c: a, lambda a, c: a)
LINEAR = Layout("linear", lambda a, c: a.T, lambda a, c: a.T)  # [out, in] <-> [in, out]
HEADS_IN = Layout(  # q, k, v: HF [N*H, D] <-> ours [D, N, H]
    "heads_in",
    lambda a, c: a.reshape(c.num_heads, c.d_kv, a.shape[-1]).transpose(2, 0, 1),
    lambda a, c: a.transpose(1, 2, 0).reshape(c.num_heads * c.d_kv, a.shape[0]))
HEADS_OUT = Layout(  # o: HF [D, N*H] <-> ours [N, H, D]
    "heads_out",
    lambda a, c: a.T.reshape(c.num_heads, c.d_kv, a.shape[0]),
    lambda a, c: a.reshape(c.num_heads * c.d_kv, a.shape[-1]).T)


@dataclasses.dataclass(frozen=True)
class Row:
  path: tuple  # Keys into our params pytree (str for dicts, int for layer lists).
  hf_name: str
  layout: Layout


def _attention_rows(path: tuple, hf_prefix: str) -> list[Row]:
  return [Row(path + (n,), f"{hf_prefix}.{n}.weight", HEADS_OUT if n == "o" else HEADS_IN) for n in "qkvo"]


def _mlp_rows(cfg: T5Config, path: tuple, hf_prefix: str) -> list[Row]:
  names = ("wi_0", "wi_1", "wo") if cfg.gated else ("wi", "wo")
  return [Row(path + (n,), f"{hf_prefix}.{n}.weight", LINEAR) for n in names]


def weight_table(cfg: T5Config) -> list[Row]:
  """Every tensor of a T5ForConditionalGeneration checkpoint with this config, in a fixed order."""
  rows = [Row(("shared", "embedding"), "shared.weight", AS_IS)]
  for stack, n_layers in (("encoder", cfg.num_layers), ("decoder", cfg.num_decoder_layers)):
    rows.append(Row((stack, "relpos_bias"),
                    f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", AS_IS))
    rows.append(Row((stack, "final_norm"), f"{stack}.final_layer_norm.weight", AS_IS))
    for i in range(n_layers):
      ours, hf = (stack, "layers", i), f"{stack}.block.{i}.layer"
      if stack == "encoder":
        blocks = [("attention", 0, "SelfAttention"), ("mlp", 1, "DenseReluDense")]
      else:
        blocks = [("self_attention", 0, "SelfAttention"), ("cross_attention", 1, "EncDecAttention"),
                  ("mlp", 2, "DenseReluDense")]
      for name, j, hf_module in blocks:
        if name == "mlp":
          rows += _mlp_rows(cfg, ours + ("mlp",), f"{hf}.{j}.{hf_module}")
        else:
          rows += _attention_rows(ours + (name,), f"{hf}.{j}.{hf_module}")
        rows.append(Row(ours + (f"{name}_norm",), f"{hf}.{j}.layer_norm.weight", AS_IS))
  if not cfg.tie_word_embeddings:
    rows.append(Row(("lm_head",), "lm_head.weight", LINEAR))
  return rows


# Tensors that real checkpoints carry and that are deliberately not read: tied copies of the shared embedding,
# and a cross-attention position bias that original T5 checkpoints include and no T5 uses.
TIED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)


def get_path(tree, path: tuple):
  for key in path:
    tree = tree[key]
  return tree


def set_path(tree: dict, path: tuple, value) -> None:
  """Sets tree[path] = value, creating dicts and layer lists (indexed by int) as needed."""
  for key, nxt in zip(path[:-1], path[1:]):
    if isinstance(key, int):
      while len(tree) <= key:
        tree.append({})
      tree = tree[key]
    else:
      tree = tree.setdefault(key, [] if isinstance(nxt, int) else {})
  tree[path[-1]] = value
