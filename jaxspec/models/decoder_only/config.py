"""Decoder-only hyperparameters: one frozen, hashable dataclass (a static jit argument) for every family.

Each flag is one architectural difference between the families that share this implementation:

| flag                                  | Llama/Mistral | Qwen2 | Qwen3 | Gemma 2 | Gemma 3 |
|---------------------------------------|---------------|-------|-------|---------|---------|
| qkv_bias (o_bias: Llama attention_bias) | opt.        | yes   | opt.  |         |         |
| qk_norm (RMSNorm of q, k per head)    |               |       | yes   |         | yes     |
| norm_offset (weights stored as w - 1) |               |       |       | 1       | 1       |
| scale_embeddings (x sqrt(hidden))     |               |       |       | yes     | yes     |
| sandwich_norms (pre+post attn / mlp)  |               |       |       | yes     | yes     |
| query_pre_attn_scalar                 |               |       |       | yes     | yes     |
| attention / final soft-caps           |               |       |       | yes     | opt.    |
| sliding-window layer_types            | Mistral v0.1  | opt.  | opt.  | 1 in 2  | 5 in 6  |
| local_rope (RoPE of sliding layers)   |               |       |       |         | yes     |

Family modules (llama.py, qwen.py, gemma.py) read a `config.json` into this class and write it back.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from jaxspec.checks import check_int

ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu")
FULL, SLIDING = "full_attention", "sliding_attention"
_ROPE_KINDS = ("default", "linear", "llama3")


def _require_positive(name: str, value) -> None:
  """Raises ValueError naming `name` unless `value` is a finite number > 0."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
    raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Rope:
  """Rotary position embedding of one kind of layer: base, and the scaling of its frequencies."""

  theta: float = 10000.0
  kind: str = "default"  # "default", "linear" (frequencies / factor) or "llama3" (Llama 3.1 wavelength bands).
  factor: float = 1.0
  low_freq_factor: float = 1.0  # llama3 only.
  high_freq_factor: float = 4.0  # llama3 only.
  original_max_position_embeddings: int = 8192  # llama3 only: the pre-training context.

  def __post_init__(self):
    if self.kind not in _ROPE_KINDS:
      raise ValueError(f"unsupported rope_type {self.kind!r}: jaxspec implements {', '.join(_ROPE_KINDS)}.")
    _require_positive("rope_theta", self.theta)  # 0, negative or non-finite bases make NaN frequencies.
    _require_positive("rope factor", self.factor)

  def inv_freq(self, head_dim: int) -> np.ndarray:
    """[head_dim // 2] float32 inverse frequencies, computed in float32 as transformers does."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = (np.float32(1.0) / np.power(np.float32(self.theta), exponents)).astype(np.float32)
    if self.kind == "linear":
      return (inv / np.float32(self.factor)).astype(np.float32)
    if self.kind == "llama3":
      old = self.original_max_position_embeddings
      low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
      wavelen = np.float32(2 * math.pi) / inv
      scaled = np.where(wavelen > low_wavelen, inv / np.float32(self.factor), inv).astype(np.float32)
      smooth = ((old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)).astype(
          np.float32)
      smoothed = (1 - smooth) * scaled / np.float32(self.factor) + smooth * scaled
      medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
      return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv

  @classmethod
  def from_hf(cls, params: dict | None, theta: float, max_position_embeddings: int) -> "Rope":
    """From a `rope_parameters` (transformers 5) or `rope_scaling` (4.x) dict and the base `theta`."""
    params = dict(params or {})
    if params.get("partial_rotary_factor", 1.0) != 1.0:
      raise ValueError(f"partial_rotary_factor {params['partial_rotary_factor']} is not supported.")
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", theta))
    if kind == "llama3":
      return cls(theta=theta, kind=kind, factor=float(params["factor"]),
                 low_freq_factor=float(params["low_freq_factor"]),
                 high_freq_factor=float(params["high_freq_factor"]),
                 original_max_position_embeddings=int(params.get("original_max_position_embeddings",
                                                                 max_position_embeddings)))
    if kind == "linear":
      return cls(theta=theta, kind=kind, factor=float(params["factor"]))
    return cls(theta=theta, kind=kind)

  def hf_scaling(self) -> dict | None:
    """The `rope_scaling` dict that transformers (4.x and 5) reads back into this Rope, None for plain RoPE."""
    if self.kind == "linear":
      return {"rope_type": "linear", "factor": self.factor}
    if self.kind == "llama3":
      return {"rope_type": "llama3", "factor": self.factor, "low_freq_factor": self.low_freq_factor,
              "high_freq_factor": self.high_freq_factor,
              "original_max_position_embeddings": self.original_max_position_embeddings}
    return None


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
  """Shapes and conventions of a decoder-only transformer (pre-norm, RoPE, gated MLP, grouped-query attention).

  Family modules subclass it only to read and write their `config.json` (`from_hf_dict`, `to_hf_dict`).
  """

  model_type: str = "llama"  # The HF model_type (kept so that a saved directory loads in transformers).
  vocab_size: int = 32000
  hidden_size: int = 4096
  intermediate_size: int = 11008
  num_layers: int = 32
  num_heads: int = 32
  num_kv_heads: int = 32  # Grouped-query attention: num_heads // num_kv_heads query heads share one K/V head.
  head_dim: int = 128
  activation: str = "silu"  # Of the gated MLP: down(act(gate(x)) * up(x)). One of ACTIVATIONS.
  rms_norm_eps: float = 1e-6
  norm_offset: float = 0.0  # RMSNorm multiplies by (norm_offset + w): Gemma stores w - 1 (offset 1).
  rope: Rope = Rope()  # RoPE of full-attention layers (of every layer when local_rope is None).
  local_rope: Rope | None = None  # RoPE of sliding-window layers when it differs (Gemma 3: base 10000).
  qkv_bias: bool = False  # Biases on the q, k and v projections (Qwen2; Llama's attention_bias).
  o_bias: bool = False  # Bias on the output projection (Llama's attention_bias).
  qk_norm: bool = False  # RMSNorm of q and k over head_dim, before RoPE (Qwen3, Gemma 3).
  scale_embeddings: bool = False  # Multiply token embeddings by sqrt(hidden_size), in the parameter dtype (Gemma).
  sandwich_norms: bool = False  # Norms after attention and after the MLP too (Gemma 2 and 3).
  query_pre_attn_scalar: float | None = None  # Scores scaled by this ** -0.5; None: head_dim ** -0.5.
  attn_logit_softcap: float | None = None  # Scores -> cap * tanh(scores / cap) before the mask (Gemma 2).
  final_logit_softcap: float | None = None  # Logits -> cap * tanh(logits / cap) (Gemma 2).
  sliding_window: int | None = None  # Keys a sliding layer's query sees: those with q - W < k <= q.
  layer_types: tuple[str, ...] = ()  # FULL or SLIDING per layer; () means every layer FULL.
  tie_word_embeddings: bool = False  # Logits from the token embedding (True) or a separate lm_head.
  max_position_embeddings: int = 2048
  bos_token_id: int | None = 1
  eos_ids: tuple[int, ...] = (2,)  # Every id that ends a sequence (config.json, or generation_config.json's).
  pad_token_id: int | None = None  # Fills outputs after EOS; None: the first EOS id (always an int after init).

  def __post_init__(self):
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"unknown activation {self.activation!r}; expected one of {ACTIVATIONS}.")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "max_position_embeddings"):
      check_int(getattr(self, name), name, 1, error=ValueError)
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}.")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}.")
    _require_positive("rms_norm_eps", self.rms_norm_eps)  # 0 divides by zero on a zero row; NaN spreads.
    eos = tuple(int(e) for e in self.eos_ids)
    if not eos:
      raise ValueError("no EOS id: config.json / generation_config.json must give eos_token_id.")
    object.__setattr__(self, "eos_ids", eos)
    if self.pad_token_id is None:
      object.__setattr__(self, "pad_token_id", eos[0])
    types = tuple(self.layer_types) or (FULL,) * self.num_layers
    if len(types) != self.num_layers or any(t not in (FULL, SLIDING) for t in types):
      raise ValueError(f"layer_types must give {FULL!r} or {SLIDING!r} for each of the {self.num_layers} layers, "
                       f"got {list(self.layer_types)}.")
    if SLIDING in types and (self.sliding_window is None or self.sliding_window < 1):
      raise ValueError(f"sliding-window layers need sliding_window >= 1, got {self.sliding_window!r}.")
    object.__setattr__(self, "layer_types", types)

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    return self.eos_ids

  def is_sliding(self, layer: int) -> bool:
    return self.layer_types[layer] == SLIDING

  def rope_of(self, layer: int) -> Rope:
    return self.local_rope if self.local_rope is not None and self.is_sliding(layer) else self.rope

  @property
  def attention_scale(self) -> float:
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  def summary(self) -> dict:
    """The fields a model's repr shows."""
    return {"type": self.model_type, "hidden": self.hidden_size, "layers": self.num_layers,
            "heads": f"{self.num_heads}/{self.num_kv_heads}kv", "vocab": self.vocab_size}

  def require(self, family: str, **fixed: Any) -> None:
    """Raises ValueError unless every named field has the value the family's architecture fixes."""
    for name, want in fixed.items():
      if getattr(self, name) != want:
        raise ValueError(f"{family} ({self.model_type}) models have {name}={want!r}, got {getattr(self, name)!r}.")

  def to_hf_dict(self) -> dict[str, Any]:
    raise NotImplementedError(f"{type(self).__name__} has no config.json format: use a family's config class "
                              f"(jaxspec.models.decoder_only.llama.LlamaConfig, qwen.QwenConfig, gemma.GemmaConfig).")

  def hf_common(self, architecture: str, activation_key: str = "hidden_act") -> dict[str, Any]:
    """The `config.json` keys every family shares; family classes add theirs."""
    eos = list(self.eos_ids)
    return {
        "architectures": [architecture], "model_type": self.model_type, "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim, activation_key: self.activation,
        "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope.theta, "rope_scaling": self.rope.hf_scaling(),
        "tie_word_embeddings": self.tie_word_embeddings, "max_position_embeddings": self.max_position_embeddings,
        "bos_token_id": self.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "pad_token_id": self.pad_token_id, "attention_dropout": 0.0,
    }


class HFReader:
  """Reads a `config.json` dict with a family's transformers defaults for absent keys (transformers 4.x wrote
  only the values that differ from them). A key present with null stays None (Mistral's "sliding_window": null)."""

  def __init__(self, raw: dict, defaults: dict):
    self.raw, self.defaults = raw, defaults

  def __call__(self, key: str, default: Any = None) -> Any:
    if key in self.raw:
      return self.raw[key]
    return self.defaults.get(key, default)

  def common(self) -> dict[str, Any]:
    """DecoderOnlyConfig fields every family reads the same way (RoPE of full-attention layers included)."""
    get = self
    hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
    eos = get("eos_token_id")
    eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    max_pos = int(get("max_position_embeddings"))
    return dict(
        model_type=get("model_type"), vocab_size=int(get("vocab_size")), hidden_size=hidden,
        intermediate_size=int(get("intermediate_size")), num_layers=int(get("num_hidden_layers")),
        num_heads=heads, num_kv_heads=int(get("num_key_value_heads") or heads),
        head_dim=int(get("head_dim") or hidden // heads), rms_norm_eps=float(get("rms_norm_eps")),
        tie_word_embeddings=bool(get("tie_word_embeddings")), max_position_embeddings=max_pos,
        bos_token_id=get("bos_token_id"), eos_ids=tuple(int(e) for e in eos), pad_token_id=get("pad_token_id"),
        rope=Rope.from_hf(get("rope_parameters") or get("rope_scaling"), float(get("rope_theta", 10000.0)),
                          max_pos))
