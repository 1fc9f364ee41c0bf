"""T5 hyperparameters as a frozen, hashable dataclass (usable as a static jit argument).

Covers every public T5 family that `T5ForConditionalGeneration` runs:
- T5 1.0 (`t5-small` ... `t5-11b`): ReLU feed-forward, lm_head tied to the embedding, decoder output scaled by
  d_model**-0.5 before the lm_head;
- T5 1.1 / Flan-T5 / mT5: gated-GELU feed-forward, untied lm_head, no output scaling.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from jaxspec.checks import check_int

_ACTIVATIONS = ("relu", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "swish")


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Shapes and conventions of a T5 encoder-decoder."""

  vocab_size: int = 32128
  d_model: int = 512
  d_kv: int = 64  # Per-head width; num_heads * d_kv need not equal d_model.
  d_ff: int = 2048
  num_layers: int = 6  # Encoder layers.
  num_decoder_layers: int = 6
  num_heads: int = 8
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  activation: str = "relu"  # One of _ACTIVATIONS.
  gated: bool = False  # True: wo(act(wi_0 x) * wi_1 x); False: wo(act(wi x)).
  tie_word_embeddings: bool = True  # True: logits use the shared embedding; False: a separate lm_head.
  scale_decoder_outputs: bool = True  # Multiply the decoder output by d_model**-0.5 before the logits.
  pad_token_id: int = 0
  eos_token_id: int = 1
  decoder_start_token_id: int = 0
  model_type: str = "t5"  # "t5" or "mt5": kept so that a saved HF directory loads in transformers.

  def __post_init__(self):
    if self.activation not in _ACTIVATIONS:
      raise ValueError(f"Unknown T5 activation {self.activation!r}; expected one of {_ACTIVATIONS}.")
    for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
                 "relative_attention_num_buckets", "relative_attention_max_distance"):
      value = getattr(self, name)
      check_int(value, f"T5Config.{name}", 1, error=ValueError)
    for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < self.vocab_size:
        raise ValueError(f"T5Config.{name} must be a token id in [0, {self.vocab_size}), got {value!r}.")
    eps = self.layer_norm_epsilon
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps <= 0:
      raise ValueError(f"T5Config.layer_norm_epsilon must be a finite number > 0, got {eps!r}.")

  def summary(self) -> dict:
    """The fields a model's repr shows."""
    return {"d_model": self.d_model, "layers": f"{self.num_layers}/{self.num_decoder_layers}",
            "heads": self.num_heads, "vocab": self.vocab_size}

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    return (self.eos_token_id,)

  @property
  def feed_forward_proj(self) -> str:
    return ("gated-" if self.gated else "") + ("gelu" if self.gated and self.activation == "gelu_new"
                                                else self.activation)

  @classmethod
  def from_hf_dict(cls, cfg: dict[str, Any]) -> "T5Config":
    """Reads a Hugging Face `config.json` dict (transformers 4.x or 5.x conventions), with HF's defaults."""
    proj = cfg.get("feed_forward_proj", "relu")
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
      raise ValueError(f"Unsupported feed_forward_proj {proj!r}: expected 'ACT' or 'gated-ACT'.")
    activation = "gelu_new" if proj == "gated-gelu" else cfg.get("dense_act_fn", parts[-1])
    tie = cfg.get("tie_word_embeddings", True) is not False
    scale = cfg.get("scale_decoder_outputs", tie)
    num_layers = cfg.get("num_layers", 6)
    eos = cfg.get("eos_token_id", 1)
    if isinstance(eos, list):
      eos = eos[0]
    return cls(
        vocab_size=cfg.get("vocab_size", 32128),
        d_model=cfg.get("d_model", 512),
        d_kv=cfg.get("d_kv", 64),
        d_ff=cfg.get("d_ff", 2048),
        num_layers=num_layers,
        num_decoder_layers=cfg.get("num_decoder_layers") or num_layers,
        num_heads=cfg.get("num_heads", 8),
        relative_attention_num_buckets=cfg.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=cfg.get("relative_attention_max_distance", 128),
        layer_norm_epsilon=cfg.get("layer_norm_epsilon", 1e-6),
        activation=activation,
        gated=parts[0] == "gated" and len(parts) == 2,
        tie_word_embeddings=tie,
        scale_decoder_outputs=bool(scale),
        pad_token_id=cfg.get("pad_token_id", 0) if cfg.get("pad_token_id") is not None else 0,
        eos_token_id=eos if eos is not None else 1,
        decoder_start_token_id=cfg.get("decoder_start_token_id", 0) if cfg.get(
            "decoder_start_token_id") is not None else 0,
        model_type=cfg.get("model_type", "t5"),
    )

  def to_hf_dict(self) -> dict[str, Any]:
    """The `config.json` dict that transformers reads back into the same architecture."""
    arch = "MT5ForConditionalGeneration" if self.model_type == "mt5" else "T5ForConditionalGeneration"
    return {
        "architectures": [arch],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "d_model": self.d_model,
        "d_kv": self.d_kv,
        "d_ff": self.d_ff,
        "num_layers": self.num_layers,
        "num_decoder_layers": self.num_decoder_layers,
        "num_heads": self.num_heads,
        "relative_attention_num_buckets": self.relative_attention_num_buckets,
        "relative_attention_max_distance": self.relative_attention_max_distance,
        "layer_norm_epsilon": self.layer_norm_epsilon,
        "feed_forward_proj": self.feed_forward_proj,
        "dense_act_fn": self.activation,
        "is_gated_act": self.gated,
        "tie_word_embeddings": self.tie_word_embeddings,
        "scale_decoder_outputs": self.scale_decoder_outputs,
        "pad_token_id": self.pad_token_id,
        "eos_token_id": self.eos_token_id,
        "decoder_start_token_id": self.decoder_start_token_id,
        "is_encoder_decoder": True,
        "dropout_rate": 0.0,
    }
