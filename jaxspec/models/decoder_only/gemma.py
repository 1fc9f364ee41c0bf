"""Gemma 2 and Gemma 3 (text) as a family.

Both: embeddings scaled by sqrt(hidden) (rounded to the parameter dtype), RMSNorm weights stored as w - 1, norms
before AND after attention and the MLP, scores scaled by `query_pre_attn_scalar` ** -0.5, a GeGLU MLP
(gelu_pytorch_tanh), tied embeddings, alternating sliding-window and global layers. Gemma 2 soft-caps attention
scores (50) and final logits (30); Gemma 3 normalises q and k per head instead, slides 5 layers in 6 and gives its
sliding layers their own RoPE base (`rope_local_base_freq`, 10000; global layers 1e6, with `rope_scaling` on
the global layers only). A multimodal "gemma3" directory (Gemma3ForConditionalGeneration) is refused: load a
text-only checkpoint (model_type gemma3_text).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxspec.models.decoder_only.config import FULL, SLIDING, DecoderOnlyConfig, HFReader, Rope
from jaxspec.models.decoder_only.family import make_family

_COMMON = dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
               num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
               pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True, attention_bias=False,
               query_pre_attn_scalar=256, sliding_window=4096)
# transformers' defaults, for keys that a config.json leaves out.
_DEFAULTS = {
    "gemma2": dict(_COMMON, vocab_size=256000, max_position_embeddings=8192, rope_theta=10000.0,
                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
    "gemma3_text": dict(_COMMON, vocab_size=262208, max_position_embeddings=131072, rope_theta=1_000_000.0,
                        rope_local_base_freq=10000.0, final_logit_softcapping=None, attn_logit_softcapping=None,
                        sliding_window_pattern=6),
}
_ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


@dataclasses.dataclass(frozen=True)
class GemmaConfig(DecoderOnlyConfig):
  """A DecoderOnlyConfig of model_type "gemma2" or "gemma3_text"."""

  def __post_init__(self):
    super().__post_init__()
    if self.model_type not in _DEFAULTS:
      raise ValueError(f"GemmaConfig reads model_type gemma2 or gemma3_text, got {self.model_type!r}.")
    self.require("Gemma", norm_offset=1.0, scale_embeddings=True, sandwich_norms=True, o_bias=self.qkv_bias)
    if self.model_type == "gemma2":
      self.require("Gemma 2", qk_norm=False, local_rope=None)
    else:
      self.require("Gemma 3", qk_norm=True)
      if self.local_rope is None or self.local_rope.kind != "default":
        raise ValueError(f"Gemma 3's sliding layers need their own plain RoPE (local_rope), got {self.local_rope}.")

  @classmethod
  def from_hf_dict(cls, raw: dict[str, Any]) -> "GemmaConfig":
    model_type = raw.get("model_type", "gemma2")
    if model_type == "gemma3" or "text_config" in raw:
      raise ValueError("this is a multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration): jaxspec runs the "
                       "text-only Gemma 3 checkpoints (model_type gemma3_text, e.g. gemma-3-270m, gemma-3-1b).")
    get = HFReader(raw, _DEFAULTS[model_type])
    if get("use_bidirectional_attention"):
      raise ValueError("use_bidirectional_attention=true (an embedding model, not a causal LM) is not supported.")
    common = get.common()
    layers = common["num_layers"]
    local_rope = None
    if model_type == "gemma2":
      default_types = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    else:
      pattern = get("sliding_window_pattern")
      default_types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
      nested = get("rope_parameters") or {}
      if FULL in nested or SLIDING in nested:  # transformers 5: one dict per layer type.
        common["rope"] = Rope.from_hf(nested.get(FULL), 1_000_000.0, common["max_position_embeddings"])
        local_rope = Rope.from_hf(nested.get(SLIDING), 10000.0, common["max_position_embeddings"])
      else:  # transformers 4.x: rope_theta and rope_scaling for global layers, rope_local_base_freq for local.
        local_rope = Rope(theta=float(get("rope_local_base_freq")))
    bias = bool(get("attention_bias"))
    return cls(**common, activation=get("hidden_activation"), norm_offset=1.0, scale_embeddings=True,
               sandwich_norms=True, qkv_bias=bias, o_bias=bias, qk_norm=model_type == "gemma3_text",
               local_rope=local_rope, query_pre_attn_scalar=get("query_pre_attn_scalar"),
               attn_logit_softcap=get("attn_logit_softcapping"), final_logit_softcap=get("final_logit_softcapping"),
               sliding_window=get("sliding_window"), layer_types=tuple(get("layer_types") or default_types))

  def to_hf_dict(self) -> dict[str, Any]:
    out = self.hf_common(_ARCHITECTURES[self.model_type], activation_key="hidden_activation")
    out.update(attention_bias=self.qkv_bias, query_pre_attn_scalar=self.query_pre_attn_scalar,
               attn_logit_softcapping=self.attn_logit_softcap, final_logit_softcapping=self.final_logit_softcap,
               sliding_window=self.sliding_window, layer_types=list(self.layer_types))
    if self.local_rope is not None:
      out["rope_local_base_freq"] = self.local_rope.theta
    return out


FAMILY = make_family("gemma", ("gemma2", "gemma3_text", "gemma3"), GemmaConfig)
