"""The mapping between Hugging Face decoder-only tensor names (`*ForCausalLM`) and jaxspec's parameter pytree.

One table row per tensor (see jaxspec/models/hf_table.py), built from the config's flags: every family here names
its tensors `model.embed_tokens`, `model.layers.{i}.self_attn.{q,k,v,o}_proj`, `model.layers.{i}.mlp.{gate,up,
down}_proj`, `model.norm` and `lm_head`. They differ in which tensors exist (biases, q/k norms) and in one name:
Llama's `post_attention_layernorm` is the norm BEFORE the MLP, while Gemma's sandwich layers call that one
`pre_feedforward_layernorm` and use `post_attention_layernorm` after attention.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxspec.models.decoder_only.config import DecoderOnlyConfig
from jaxspec.models.hf_table import AS_IS, LINEAR, Row, heads_bias, heads_in, heads_out

_Q_IN = heads_in(lambda c: c.num_heads, lambda c: c.head_dim)  # q: HF [N*H, D] <-> ours [D, N, H]
_KV_IN = heads_in(lambda c: c.num_kv_heads, lambda c: c.head_dim)  # k, v: HF [K*H, D] <-> ours [D, K, H]
_O_OUT = heads_out(lambda c: c.num_heads, lambda c: c.head_dim)  # o: HF [D, N*H] <-> ours [N, H, D]
_Q_BIAS = heads_bias(lambda c: c.num_heads, lambda c: c.head_dim)
_KV_BIAS = heads_bias(lambda c: c.num_kv_heads, lambda c: c.head_dim)


def _layer_rows(cfg: DecoderOnlyConfig, i: int) -> list[Row]:
  ours, hf = ("layers", i), f"model.layers.{i}"
  att, hf_att = ours + ("attention",), f"{hf}.self_attn"
  rows = [Row(ours + ("attention_norm",), f"{hf}.input_layernorm.weight", AS_IS),
          Row(att + ("q",), f"{hf_att}.q_proj.weight", _Q_IN),
          Row(att + ("k",), f"{hf_att}.k_proj.weight", _KV_IN),
          Row(att + ("v",), f"{hf_att}.v_proj.weight", _KV_IN),
          Row(att + ("o",), f"{hf_att}.o_proj.weight", _O_OUT)]
  if cfg.qkv_bias:
    rows += [Row(att + ("q_bias",), f"{hf_att}.q_proj.bias", _Q_BIAS),
             Row(att + ("k_bias",), f"{hf_att}.k_proj.bias", _KV_BIAS),
             Row(att + ("v_bias",), f"{hf_att}.v_proj.bias", _KV_BIAS)]
  if cfg.o_bias:
    rows.append(Row(att + ("o_bias",), f"{hf_att}.o_proj.bias", AS_IS))
  if cfg.qk_norm:
    rows += [Row(att + ("q_norm",), f"{hf_att}.q_norm.weight", AS_IS),
             Row(att + ("k_norm",), f"{hf_att}.k_norm.weight", AS_IS)]
  if cfg.sandwich_norms:
    rows += [Row(ours + ("post_attention_norm",), f"{hf}.post_attention_layernorm.weight", AS_IS),
             Row(ours + ("mlp_norm",), f"{hf}.pre_feedforward_layernorm.weight", AS_IS),
             Row(ours + ("post_mlp_norm",), f"{hf}.post_feedforward_layernorm.weight", AS_IS)]
  else:
    rows.append(Row(ours + ("mlp_norm",), f"{hf}.post_attention_layernorm.weight", AS_IS))
  rows += [Row(ours + ("mlp", n), f"{hf}.mlp.{n}_proj.weight", LINEAR) for n in ("gate", "up", "down")]
  return rows


def weight_table(cfg: DecoderOnlyConfig) -> list[Row]:
  """Every tensor of a `*ForCausalLM` checkpoint with this config, in a fixed order."""
  rows = [Row(("embedding",), "model.embed_tokens.weight", AS_IS)]
  for i in range(cfg.num_layers):
    rows += _layer_rows(cfg, i)
  rows.append(Row(("final_norm",), "model.norm.weight", AS_IS))
  if not cfg.tie_word_embeddings:
    rows.append(Row(("lm_head",), "lm_head.weight", LINEAR))
  return rows


def ignored_names(cfg: DecoderOnlyConfig) -> set[str]:
  """HF tensors a checkpoint may hold that this config does not read: rotary caches of old checkpoints, and a
  copy of the embedding saved as lm_head by a tied model."""
  rotary = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(cfg.num_layers)}
  return rotary | {"model.rotary_emb.inv_freq"} | ({"lm_head.weight"} if cfg.tie_word_embeddings else set())


def fit_to_checkpoint(cfg: DecoderOnlyConfig, names: set[str],
                      get: Callable[[str], np.ndarray]) -> DecoderOnlyConfig:
  """Unties the logits exactly when the checkpoint holds an lm_head that differs from the embedding (an exact copy
  ties them). Without an lm_head, config.json decides: an untied config's missing lm_head stays missing (load then
  names it); it is never silently replaced by the embedding."""
  if "lm_head.weight" not in names:
    return cfg
  untied = not np.array_equal(get("lm_head.weight"), get("model.embed_tokens.weight"))
  return dataclasses.replace(cfg, tie_word_embeddings=not untied)
