"""The mapping between Hugging Face T5 tensor names and jaxspec's T5 parameter pytree.

One table row per tensor (see jaxspec/models/hf_table.py). A test checks that the table covers every tensor
transformers writes for each T5 family, so no weight is silently missing or unused.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from jaxspec.models.hf_table import AS_IS, LINEAR, Row, heads_in, heads_out
from jaxspec.models.t5.config import T5Config

HEADS_IN = heads_in(lambda c: c.num_heads, lambda c: c.d_kv)  # q, k, v: HF [N*H, D] <-> ours [D, N, H]
HEADS_OUT = heads_out(lambda c: c.num_heads, lambda c: c.d_kv)  # o: HF [D, N*H] <-> ours [N, H, D]


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


def ignored_names(cfg: T5Config) -> set[str]:
  """HF tensors a checkpoint may hold that this config does not read."""
  return set(TIED_COPIES) | set(IGNORED) | ({"lm_head.weight"} if cfg.tie_word_embeddings else set())


def fit_to_checkpoint(cfg: T5Config, names: set[str], get: Callable[[str], np.ndarray]) -> T5Config:
  """transformers unties lm_head exactly when the checkpoint holds an lm_head different from `shared`; a missing
  lm_head of a config with tie_word_embeddings=false stays missing (load names it), never the embedding."""
  import dataclasses
  if "lm_head.weight" not in names:
    return cfg
  untied = not np.array_equal(get("lm_head.weight"), get("shared.weight"))
  return dataclasses.replace(cfg, tie_word_embeddings=not untied)
