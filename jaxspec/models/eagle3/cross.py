"""The cross-attention sublayer of an EAGLE-3 head for a T5 (encoder-decoder) target (`Eagle3Config.
encoder_hidden_size` set; architectures ["T5Eagle3Head"]; docs/heads.md, "T5 targets").

    enc = encoder_kv(params, cfg, encoded, mask)        # once per input: [B, S, De] -> keys / values [B, S, K, Hd]
    h = attend(params, cfg, h, enc)                     # inside the head's layer, after its self-attention

Why. A T5 target's decoder features carry what the decoder has read of the source through its own
cross-attention, but only as much of it as the target needed for the token it just predicted; the head drafts
several tokens ahead, and what it drafts (a translation, a summary) is mostly a function of the source. So the
head reads the source itself: one cross-attention sublayer (its own RMSNorm and q / k / v / o projections, no
position encoding, grouped-query heads as its self-attention) over the target's FINAL encoder output (after the
encoder's final norm: what every decoder layer of the target reads), placed between the self-attention and the
MLP as in a T5 decoder layer:

    h = g + o(self_attention(concat(input_norm(embed(token)), hidden_norm(g))))   # EAGLE-3, unchanged
    h = h + cross_o(attention(cross_q(cross_norm(h)), cross_k(encoded), cross_v(encoded)))   # this module
    out = h + mlp(mlp_norm(h))

The encoder runs once per input (the target's prefill, which returns its output beside the cache); the head
projects it into keys and values once (`encoder_kv`, at the drafter's `init`) and keeps them in its cache
(`Eagle3Cache.encoder`), never rolled back: rollback changes lengths only. Padded encoder positions (mask False)
are never attended to.

Shape letters: B batch, T entries, S encoder positions, De encoder width, H the head's hidden size, N / K query /
key-value heads, Hd head_dim.
"""

from __future__ import annotations

import jax
from flax import struct

from jaxspec.models.decoder_only import layers
from jaxspec.models.eagle3.config import Eagle3Config


@struct.dataclass
class EncoderKV:
  """The head's cross-attention keys and values of one batch of encoder outputs (computed once per input)."""

  k: jax.Array  # [B, S, K, Hd]
  v: jax.Array  # [B, S, K, Hd]
  mask: jax.Array  # [B, S] bool, True at real (non-pad) encoder positions.


def param_axes(cfg: Eagle3Config) -> dict:
  """Logical axis names of the sublayer's parameters (merged into `eagle3.model.param_axes`)."""
  return {"cross_norm": ("embed",),
          "cross_attention": {"q": ("embed", "heads", "kv"), "k": ("encoder_embed", "kv_heads", "kv"),
                              "v": ("encoder_embed", "kv_heads", "kv"), "o": ("heads", "kv", "embed")}}


def encoder_kv(params: dict, cfg: Eagle3Config, encoded: jax.Array, mask: jax.Array) -> EncoderKV:
  """Keys and values [B, S, K, Hd] of the target's final encoder output `encoded` [B, S, De]; mask [B, S]."""
  if encoded.shape[-1] != cfg.encoder_hidden_size:
    raise ValueError(f"the head cross-attends to encoder outputs {cfg.encoder_hidden_size} wide "
                     f"(encoder_hidden_size), got {encoded.shape[-1]}.")
  a = params["cross_attention"]
  dtype = a["k"].dtype
  encoded = encoded.astype(dtype)
  return EncoderKV(k=layers.project(encoded, a["k"]), v=layers.project(encoded, a["v"]), mask=mask.astype(bool))


def attend(params: dict, cfg: Eagle3Config, h: jax.Array, enc: EncoderKV) -> jax.Array:
  """h [B, T, H] plus the cross-attention of cross_norm(h) to the encoder positions of `enc` (its residual)."""
  a = params["cross_attention"]
  q = layers.project(layers.rms_norm(h, params["cross_norm"], cfg.rms_norm_eps, 0.0), a["q"])  # [B, T, N, Hd]
  allowed = enc.mask[:, None, None, None, :]  # [B, 1, 1, 1, S]: every entry sees every real encoder position
  o = layers.attend(q, enc.k, enc.v, allowed, cfg.head_dim ** -0.5, None)
  return h + layers.output_projection(o, a["o"]).astype(h.dtype)

