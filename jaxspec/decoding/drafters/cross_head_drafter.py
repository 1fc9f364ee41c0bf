"""`CrossHeadDrafter`: `HeadDrafter` for a T5 (encoder-decoder) target's feature head, whose layer also
cross-attends to the target's encoder output (`jaxspec.models.eagle3.cross`; docs/heads.md, "T5 targets").

    out = jaxspec.generate(t5_target, inputs, jaxspec.Speculation(jaxspec.load(t5_head_dir), gamma=3))

Everything but `init` is `HeadDrafter`'s: the same invariants (head_drafter.py), drafting, settle and rollback.
Its static `reads_encoder` makes the loop's prefill call the target's `prefill(..., encoder=True)`, which runs the
encoder once and returns its output beside the target's cache; `init` projects it into the head's cross-attention
keys and values once (`Eagle3Head.encoder_kv`) and keeps them in the head's cache (`Eagle3Cache.encoder`), where
`rollback` never touches them (it sets lengths only).

T5's decoder starts empty: the prompt has no decoder features ([B, 0, F]), so the head starts with an empty cache
and a zero `hidden`. Its first draft of a call (the token after the decoder start token) is drawn from the logits
of that zero input (uniform over the draft vocabulary): it costs acceptance in the first iteration, never exactness.
From the first settle on, the head holds the start token's entry, written from the target's real features.

Shapes: B batch, S encoder positions, D the target's d_model, F = 3 * D.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxspec.decoding.drafters.head_drafter import HeadDrafter, HeadState


@dataclasses.dataclass(frozen=True)
class CrossHeadDrafter(HeadDrafter):
  """A T5 target's feature head behind the `Drafter` protocol (hashable: part of the loop's static settings)."""

  reads_encoder: bool = True  # The loop's prefill passes init the target's encoder output (device/drafter.py).

  def __post_init__(self):
    super().__post_init__()
    if not self.head.config.cross_attention:
      raise ValueError("CrossHeadDrafter needs a T5 target's head (Eagle3Config.encoder_hidden_size set); a "
                       "decoder-only target's head drafts with HeadDrafter.")

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None):
    """An empty head cache holding the encoder's keys and values, and a zero `hidden`.

    features: [B, 0, F] (T5's decoder starts empty); encoder: (encoded [B, S, D], mask [B, S] bool) from the
    target's `prefill(..., encoder=True)`."""
    if encoder is None:
      raise ValueError("CrossHeadDrafter.init needs the target's encoder output (encoder=(encoded, mask)): the "
                       "loop's prefill passes it to drafters with reads_encoder.")
    if features is not None and features.shape[1] != 0:
      raise ValueError(f"CrossHeadDrafter drafts for an encoder-decoder target, whose decoder starts empty; got "
                       f"prompt features of {features.shape[1]} positions.")
    encoded, mask = encoder
    head_params, batch = params["head"], input_ids.shape[0]
    dtype = head_params["fc"].dtype
    cache = self.head.init_cache(batch, cache_len, dtype, encoder=self.head.encoder_kv(head_params, encoded, mask))
    return HeadState(cache=cache, hidden=jnp.zeros((batch, self.head.config.hidden_size), dtype))
