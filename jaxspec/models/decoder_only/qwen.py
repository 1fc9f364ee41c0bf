"""Qwen2 / Qwen2.5 (biases on q, k and v) and Qwen3 (RMSNorm of q and k per head before RoPE) as a family.

Both may declare sliding-window layers (`use_sliding_window`, the layers from `max_window_layers` on, or explicit
`layer_types`); released Qwen2.5 and Qwen3 checkpoints set use_sliding_window false.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxspec.models.decoder_only.config import FULL, SLIDING, DecoderOnlyConfig, HFReader
from jaxspec.models.decoder_only.family import make_family

_COMMON = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
               num_attention_heads=32, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
               tie_word_embeddings=False, rope_theta=10000.0, use_sliding_window=False, sliding_window=4096,
               max_window_layers=28, bos_token_id=None, eos_token_id=None, pad_token_id=None)
# transformers' defaults, for keys that a config.json leaves out.
_DEFAULTS = {"qwen2": _COMMON, "qwen3": dict(_COMMON, head_dim=128, attention_bias=False)}
_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@dataclasses.dataclass(frozen=True)
class QwenConfig(DecoderOnlyConfig):
  """A DecoderOnlyConfig of model_type "qwen2" or "qwen3"."""

  def __post_init__(self):
    super().__post_init__()
    if self.model_type not in _DEFAULTS:
      raise ValueError(f"QwenConfig reads model_type qwen2 or qwen3, got {self.model_type!r}.")
    self.require("Qwen", norm_offset=0.0, local_rope=None, scale_embeddings=False, sandwich_norms=False,
                  query_pre_attn_scalar=None, attn_logit_softcap=None, final_logit_softcap=None)
    if self.model_type == "qwen2":
      self.require("Qwen2", qkv_bias=True, o_bias=False, qk_norm=False)
    else:
      self.require("Qwen3", qk_norm=True, o_bias=self.qkv_bias)

  @classmethod
  def from_hf_dict(cls, raw: dict[str, Any]) -> "QwenConfig":
    raw = {"model_type": "qwen2", **raw}
    qwen3 = raw["model_type"] == "qwen3"
    get = HFReader(raw, _DEFAULTS.get(raw["model_type"], _COMMON))
    common = get.common()
    window = get("sliding_window") if get("use_sliding_window") else None
    layers = common["num_layers"]
    types = get("layer_types") or [SLIDING if window is not None and i >= get("max_window_layers") else FULL
                                   for i in range(layers)]
    bias = bool(get("attention_bias")) if qwen3 else True
    return cls(**common, activation=get("hidden_act"), qkv_bias=bias, o_bias=bias and qwen3, qk_norm=qwen3,
               sliding_window=window, layer_types=tuple(types) if window is not None else (FULL,) * layers)

  def to_hf_dict(self) -> dict[str, Any]:
    out = self.hf_common(_ARCHITECTURES[self.model_type])
    sliding = SLIDING in self.layer_types
    out.update(use_sliding_window=sliding, sliding_window=self.sliding_window if sliding else None,
               max_window_layers=self.layer_types.index(SLIDING) if sliding else self.num_layers,
               layer_types=list(self.layer_types))
    if self.model_type == "qwen3":
      out["attention_bias"] = self.qkv_bias
    return out


FAMILY = make_family("qwen", ("qwen2", "qwen3"), QwenConfig)
