"""Llama (2, 3, 3.1, 3.2: `rope_scaling` "llama3" or "linear"; tied or untied embeddings) and Mistral as a family.

Llama's `attention_bias` puts biases on q, k, v and o. Mistral is Llama with a sliding window on every layer when
`sliding_window` is set (v0.1: 4096; later versions: null).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxspec.models.decoder_only.config import FULL, SLIDING, DecoderOnlyConfig, HFReader
from jaxspec.models.decoder_only.family import make_family

_COMMON = dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, hidden_act="silu",
               rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=None, tie_word_embeddings=False,
               rope_theta=10000.0, attention_bias=False, mlp_bias=False)
# transformers' defaults, for keys that a config.json leaves out.
_DEFAULTS = {
    "llama": dict(_COMMON, intermediate_size=11008, max_position_embeddings=2048, sliding_window=None),
    "mistral": dict(_COMMON, intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=131072,
                    sliding_window=4096),
}
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}


@dataclasses.dataclass(frozen=True)
class LlamaConfig(DecoderOnlyConfig):
  """A DecoderOnlyConfig of model_type "llama" or "mistral"."""

  def __post_init__(self):
    super().__post_init__()
    if self.model_type not in _DEFAULTS:
      raise ValueError(f"LlamaConfig reads model_type llama or mistral, got {self.model_type!r}.")
    self.require("Llama", norm_offset=0.0, local_rope=None, qk_norm=False, scale_embeddings=False,
                 sandwich_norms=False, query_pre_attn_scalar=None, attn_logit_softcap=None, final_logit_softcap=None,
                 o_bias=self.qkv_bias)
    if self.model_type == "llama":
      self.require("Llama", layer_types=(FULL,) * self.num_layers)
    else:
      self.require("Mistral", qkv_bias=False)
      if len(set(self.layer_types)) != 1:
        raise ValueError("Mistral models slide their window on every layer or on none.")

  @classmethod
  def from_hf_dict(cls, raw: dict[str, Any]) -> "LlamaConfig":
    raw = {"model_type": "llama", **raw}
    get = HFReader(raw, _DEFAULTS.get(raw["model_type"], _DEFAULTS["llama"]))
    if get("mlp_bias"):
      raise ValueError("mlp_bias=true (biases on the MLP) is not supported.")
    common = get.common()
    window = get("sliding_window") if raw["model_type"] == "mistral" else None
    bias = bool(get("attention_bias"))
    return cls(**common, activation=get("hidden_act"), qkv_bias=bias, o_bias=bias, sliding_window=window,
               layer_types=(SLIDING if window else FULL,) * common["num_layers"])

  def to_hf_dict(self) -> dict[str, Any]:
    out = self.hf_common(_ARCHITECTURES[self.model_type])
    if self.model_type == "mistral":
      out["sliding_window"] = self.sliding_window if self.is_sliding(0) else None
    else:
      out.update(attention_bias=self.qkv_bias, mlp_bias=False)
    return out


FAMILY = make_family("llama", ("llama", "mistral"), LlamaConfig)
