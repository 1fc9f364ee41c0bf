"""EAGLE-3 head hyperparameters: one frozen, hashable dataclass (a static jit argument), read from and written to
the `config.json` of an EAGLE-3 / SpecForge head (architectures ["LlamaForCausalLMEagle3"], model_type "llama").

What the reference (specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3, after SafeAILab/EAGLE) reads:
  hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim, hidden_act, rms_norm_eps,
  RoPE (rope_theta + rope_scaling, or transformers 5's rope_parameters), max_position_embeddings;
  vocab_size (the TARGET's vocabulary: t2d rows, embedding rows), draft_vocab_size (lm_head rows);
  target_hidden_size (feature width per target layer, default hidden_size: fc takes 3 * it);
  fc_norm (an RMSNorm per feature chunk before fc, default false), norm_output (the final norm before lm_head,
  default true); eagle_config.eagle_aux_hidden_state_layer_ids (the target layers whose OUTPUTS are the features).

A head for a T5 (encoder-decoder) target is jaxspec's own extension (docs/heads.md, "T5 targets"): architectures
["T5Eagle3Head"], the same fields plus encoder_hidden_size (the width of the target's final encoder output that
its cross-attention sublayer reads). A distinct architecture name, so that a loader of the reference refuses it
instead of dropping the cross-attention weights it does not know.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxspec.checks import check_int, is_int
from jaxspec.errors import CheckpointError
from jaxspec.models.decoder_only.config import ACTIVATIONS, Rope

ARCHITECTURE = "LlamaForCausalLMEagle3"
CROSS_ARCHITECTURE = "T5Eagle3Head"  # jaxspec's head for T5 targets (a cross-attention sublayer).
ARCHITECTURES = (ARCHITECTURE, CROSS_ARCHITECTURE)


_REQUIRED = object()


def _field(raw: dict, name: str, kind: type, default: Any = _REQUIRED) -> Any:
  """config.json's `name` as `kind` (int, float, bool or str); `default` when absent or null (required when
  no default); CheckpointError naming the field when it is missing or of another type."""
  value = raw.get(name)
  if value is None:
    if default is _REQUIRED:
      raise CheckpointError(f"EAGLE-3 head: config.json has no {name}.")
    return default
  ok = {int: is_int(value) or (isinstance(value, float) and value.is_integer()),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        bool: isinstance(value, bool), str: isinstance(value, str)}[kind]
  if not ok:
    raise CheckpointError(f"EAGLE-3 head: config.json's {name} must be {_KINDS[kind]}, got {value!r}.")
  return kind(value)


_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
  """Shapes and conventions of an EAGLE-3 head: one Llama decoder layer over [embedding, fused feature]."""

  vocab_size: int = 128256  # The target's vocabulary (t2d rows, embedding rows, the logits `step` returns).
  draft_vocab_size: int = 32000  # lm_head rows: the draft vocabulary (d2t rows).
  hidden_size: int = 4096
  target_hidden_size: int = 4096  # Width of one target feature; fc maps 3 * this to hidden_size.
  intermediate_size: int = 14336
  num_heads: int = 32
  num_kv_heads: int = 8
  head_dim: int = 128
  activation: str = "silu"
  rms_norm_eps: float = 1e-5
  rope: Rope = Rope(theta=500000.0)
  max_position_embeddings: int = 2048
  fc_norm: bool = False  # RMSNorm of each of the 3 feature chunks before fc (some SpecForge heads).
  norm_output: bool = True  # Final RMSNorm before lm_head (false: lm_head reads the pre-norm output).
  # Target layer ids whose OUTPUTS are the features (specforge / sglang convention: id j = output of layer j =
  # transformers' hidden_states[j + 1]); None: the EAGLE-3 default, the inputs of layers (2, L // 2, L - 3).
  aux_layer_ids: tuple[int, ...] | None = None
  pad_token_id: int | None = None
  # None: a decoder-only target's head. An int: a T5 target's head, whose layer also cross-attends to the
  # target's final encoder output [B, S, encoder_hidden_size] (`jaxspec.models.eagle3.cross`).
  encoder_hidden_size: int | None = None

  def __post_init__(self):
    for name in ("vocab_size", "draft_vocab_size", "hidden_size", "target_hidden_size", "intermediate_size",
                 "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
      value = getattr(self, name)
      check_int(value, f"EAGLE-3 head: {name}", 1, error=CheckpointError)
    if self.draft_vocab_size > self.vocab_size:
      raise CheckpointError(f"EAGLE-3 head: draft_vocab_size {self.draft_vocab_size} exceeds the target vocabulary "
                            f"vocab_size {self.vocab_size}.")
    if self.num_heads % self.num_kv_heads:
      raise CheckpointError(f"EAGLE-3 head: num_attention_heads {self.num_heads} is not a multiple of "
                            f"num_key_value_heads {self.num_kv_heads}.")
    if self.head_dim % 2:
      raise CheckpointError(f"EAGLE-3 head: head_dim must be even for RoPE, got {self.head_dim}.")
    if self.activation not in ACTIVATIONS:
      raise CheckpointError(f"EAGLE-3 head: unknown hidden_act {self.activation!r}; expected one of {ACTIVATIONS}.")
    enc = self.encoder_hidden_size
    if enc is not None and (not isinstance(enc, int) or isinstance(enc, bool) or enc < 1):
      raise CheckpointError(f"EAGLE-3 head: encoder_hidden_size must be an integer >= 1 or None, got {enc!r}.")
    if self.aux_layer_ids is not None:
      object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))

  @property
  def cross_attention(self) -> bool:
    """A T5 target's head: its layer cross-attends to the target's encoder output."""
    return self.encoder_hidden_size is not None

  @property
  def architecture(self) -> str:
    return CROSS_ARCHITECTURE if self.cross_attention else ARCHITECTURE

  @property
  def num_features(self) -> int:
    """Target layers fused by fc: 3 (EAGLE-3's low, middle and high layers)."""
    return 3

  def feature_layers(self, num_target_layers: int) -> tuple[int, ...]:
    """The target feature indices to ask a `Decoder` for (index i: the hidden state entering layer i).

    Aux id j (the output of layer j) is index j + 1; without ids, EAGLE-3's default (2, L // 2, L - 3). Call
    `check_fits` first: it says which ids the target lacks.
    """
    if self.aux_layer_ids is None:
      return (2, num_target_layers // 2, num_target_layers - 3)
    return tuple(j + 1 for j in self.aux_layer_ids)

  @classmethod
  def from_hf_dict(cls, raw: dict[str, Any]) -> "Eagle3Config":
    """From an EAGLE-3 head's `config.json`; CheckpointError naming the field for another architecture, a field
    that is missing or of the wrong type, or what jaxspec lacks."""
    if not isinstance(raw, dict):
      raise CheckpointError(f"EAGLE-3 head: config.json must hold a JSON object, got {type(raw).__name__}.")
    architectures = raw.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
      raise CheckpointError(f"EAGLE-3 head: config.json's architectures must be a list of names, got "
                            f"{architectures!r}.")
    if not set(ARCHITECTURES) & set(architectures):
      raise CheckpointError(f"not an EAGLE-3 head: config.json has architectures {architectures}, expected "
                            f"[{ARCHITECTURE!r}] (or [{CROSS_ARCHITECTURE!r}], a T5 target's head).")
    cross = CROSS_ARCHITECTURE in architectures
    if cross and not raw.get("encoder_hidden_size"):
      raise CheckpointError(f"EAGLE-3 head: architectures [{CROSS_ARCHITECTURE!r}] (a T5 target's head) needs "
                            f"encoder_hidden_size in config.json.")
    layers = _field(raw, "num_hidden_layers", int, 1)
    if layers != 1:
      raise CheckpointError(f"EAGLE-3 head with num_hidden_layers {layers}: the reference has one decoder layer.")
    if "draft_vocab_size" not in raw:
      raise CheckpointError("EAGLE-3 head: config.json has no draft_vocab_size.")
    if raw.get("mlp_bias") or raw.get("attention_bias"):
      raise CheckpointError("EAGLE-3 head: biases (attention_bias / mlp_bias) are not in the reference head.")
    hidden, heads = _field(raw, "hidden_size", int), _field(raw, "num_attention_heads", int)
    if heads < 1:
      raise CheckpointError(f"EAGLE-3 head: config.json's num_attention_heads must be an integer >= 1, got {heads}.")
    max_pos = _field(raw, "max_position_embeddings", int, 2048)
    rope_params = raw.get("rope_parameters") or raw.get("rope_scaling")
    try:
      rope = Rope.from_hf(rope_params, _field(raw, "rope_theta", float, 10000.0), max_pos)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      if isinstance(e, CheckpointError):
        raise
      raise CheckpointError(f"EAGLE-3 head: unsupported RoPE {rope_params} in config.json (rope_scaling / "
                            f"rope_parameters): {e}") from e
    eagle_config = raw.get("eagle_config") or {}
    if not isinstance(eagle_config, dict):
      raise CheckpointError(f"EAGLE-3 head: config.json's eagle_config must be a JSON object, got {eagle_config!r}.")
    aux = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None and (not isinstance(aux, list) or not all(is_int(j) for j in aux)):
      raise CheckpointError(f"EAGLE-3 head: config.json's eagle_config.eagle_aux_hidden_state_layer_ids must be a "
                            f"list of layer ids (integers), got {aux!r}.")
    activation = _field(raw, "hidden_act", str, "silu")
    pad = raw.get("pad_token_id")
    if pad is not None and not is_int(pad):
      raise CheckpointError(f"EAGLE-3 head: config.json's pad_token_id must be an integer or null, got {pad!r}.")
    return cls(vocab_size=_field(raw, "vocab_size", int), draft_vocab_size=_field(raw, "draft_vocab_size", int),
               hidden_size=hidden, target_hidden_size=_field(raw, "target_hidden_size", int, None) or hidden,
               intermediate_size=_field(raw, "intermediate_size", int), num_heads=heads,
               num_kv_heads=_field(raw, "num_key_value_heads", int, None) or heads,
               head_dim=_field(raw, "head_dim", int, None) or hidden // heads, activation=activation,
               rms_norm_eps=_field(raw, "rms_norm_eps", float, 1e-6), rope=rope, max_position_embeddings=max_pos,
               fc_norm=_field(raw, "fc_norm", bool, False), norm_output=_field(raw, "norm_output", bool, True),
               aux_layer_ids=None if aux is None else tuple(aux), pad_token_id=pad,
               encoder_hidden_size=_field(raw, "encoder_hidden_size", int) if cross else None)

  def to_hf_dict(self) -> dict[str, Any]:
    """The `config.json` that `from_hf_dict` and the reference (transformers' LlamaConfig) read back."""
    out = {
        "architectures": [self.architecture], "model_type": "llama", "vocab_size": self.vocab_size,
        "draft_vocab_size": self.draft_vocab_size, "hidden_size": self.hidden_size,
        "target_hidden_size": self.target_hidden_size, "intermediate_size": self.intermediate_size,
        "num_hidden_layers": 1, "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim, "hidden_act": self.activation, "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope.theta, "rope_scaling": self.rope.hf_scaling(),
        "max_position_embeddings": self.max_position_embeddings, "fc_norm": self.fc_norm,
        "norm_output": self.norm_output, "pad_token_id": self.pad_token_id, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False,
    }
    if self.cross_attention:
      out["encoder_hidden_size"] = self.encoder_hidden_size
      out["is_encoder_decoder_target"] = True
    if self.aux_layer_ids is not None:
      out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
    return out
