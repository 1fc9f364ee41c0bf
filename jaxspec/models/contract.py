"""The contract between model families and the decoding loop: `Decoder`, `DecoderCache` and `ModelConfig`.

The loop (jaxspec/decoding/) sees a model only through these types, as t5x's decoding sees only a
`tokens_to_logits` function and gemma's sampler a `TransformerLike`:

    cache, first = decoder.prefill(params, input_ids, input_lengths, cache_len)  # encoder pass / prompt prefill
    logits, cache = decoder.step(params, cache, tokens)                         # [B, T] tokens at per-row offsets
    cache = cache.rollback(positions)                                            # per-row length change

Positions. A cache counts absolute positions per row in `lengths` [B] and the positions that precede the loop's
first token in `offsets` [B]: 0 for an encoder-decoder (the decoder starts empty, the first token is its start
token), prompt length - 1 for a decoder-only model (the prompt but its last token is prefilled; that last token is
the first one the loop feeds). The loop thinks in `positions = lengths - offsets`, the number of its own tokens
already fed, and rolls back by setting them: `rollback(positions)` is `lengths = offsets + positions`. Keys and
values past `lengths` are stale: every family masks keys by position (a query at position t sees keys at
positions <= t), so they are never attended to and are overwritten by later writes.

Shape letters: B batch, S input (encoder or prompt) positions, T new positions fed in one call, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

import jax

C = TypeVar("C", bound="DecoderCache")


class CachePositions:
  """Mixin for `flax.struct.dataclass` caches with `lengths` and `offsets` fields: positions and rollback."""

  lengths: jax.Array  # [B] int32 absolute positions written.
  offsets: jax.Array  # [B] int32 positions before the loop's first token.

  @property
  def positions(self) -> jax.Array:
    """[B] int32: the loop's tokens already fed (the first token included once fed)."""
    return self.lengths - self.offsets

  def rollback(self: C, positions: jax.Array) -> C:
    """The cache with `positions` [B] of the loop's tokens kept per row: a length change, nothing is copied."""
    return self.replace(lengths=self.offsets + positions)  # type: ignore[attr-defined]


@runtime_checkable
class DecoderCache(Protocol):
  """A family's decoder state: any pytree with per-row `lengths` and `offsets` and a `rollback` by length."""

  lengths: jax.Array
  offsets: jax.Array

  @property
  def positions(self) -> jax.Array: ...

  def rollback(self: C, positions: jax.Array) -> C: ...


@runtime_checkable
class Decoder(Protocol):
  """The two calls a decoding loop makes. Implementations are frozen dataclasses of a config: hashable, so that
  they are static arguments of the jitted loop."""

  def prefill(self, params: Any, input_ids: jax.Array, input_lengths: jax.Array,
              cache_len: int) -> tuple[DecoderCache, jax.Array]:
    """Builds the cache from the inputs, before the loop's first token.

    Args:
      params: the family's parameter pytree.
      input_ids: [B, S] int32, right-padded (encoder inputs for T5, prompts for decoder-only models).
      input_lengths: [B] int32 real tokens per row (>= 1).
      cache_len: positions the loop may write per row from its first token on (its first token included).
    Returns:
      (cache with positions == 0, first_tokens [B] int32: the token the loop feeds first: T5's decoder start
      token, or a decoder-only prompt's last token).
    """
    ...

  def step(self, params: Any, cache: DecoderCache, tokens: jax.Array) -> tuple[jax.Array, DecoderCache]:
    """Feeds tokens [B, T] at each row's position `cache.lengths`.

    Returns:
      logits [B, T, V] float32 (position t predicts the token after tokens[:, t]) and the cache with the new
      keys and values written and `lengths` advanced by T. The caller leaves room: positions + T <= cache_len.
    """
    ...


@runtime_checkable
class FeatureDecoder(Decoder, Protocol):
  """A Decoder that can also return its hidden states ("features") for a feature-head drafter (EAGLE-3).

  Feature index i is the hidden state ENTERING decoder layer i, before its norm: 0 the token embedding (as the
  family scales it), num_feature_layers the final pre-norm output. This is transformers' `output_hidden_states`
  index (hidden_states[i], i < L); EAGLE-3's aux layer id j (specforge, sglang: the output of layer j) is i = j + 1.
  `layers` is a static tuple; `prefill` and `step` stay as they are (they collect nothing).
  """

  @property
  def num_feature_layers(self) -> int: ...  # L: the largest index (decoder layers of the model).

  @property
  def feature_size(self) -> int: ...  # D: the width of one layer's feature.

  def prefill_features(self, params: Any, input_ids: jax.Array, input_lengths: jax.Array, cache_len: int,
                       layers: tuple[int, ...]) -> tuple[DecoderCache, jax.Array, jax.Array]:
    """`prefill` plus the features [B, S', len(layers) * D] of the positions it processed (S' = S for a
    decoder-only prompt, 0 for an encoder-decoder, whose decoder starts empty)."""
    ...

  def step_features(self, params: Any, cache: DecoderCache, tokens: jax.Array,
                    layers: tuple[int, ...]) -> tuple[jax.Array, jax.Array, DecoderCache]:
    """`step` plus features: (logits [B, T, V] float32, features [B, T, len(layers) * D], cache)."""
    ...


def check_feature_layers(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
  """`layers` as a non-empty tuple of ints in [0, num_layers] (num_layers: the final pre-norm output); else
  ValueError."""
  layers = tuple(int(i) for i in layers)
  if not layers or any(not 0 <= i <= num_layers for i in layers):
    raise ValueError(f"feature layers must be a non-empty tuple of indices in [0, {num_layers}] (the input of "
                     f"decoder layer i; {num_layers}: the final pre-norm output), got {layers}.")
  return layers


@runtime_checkable
class ModelConfig(Protocol):
  """What the engine and checkpoint I/O read from any family's config (a frozen, hashable dataclass)."""

  model_type: str  # The Hugging Face `model_type` this config reads and writes.
  vocab_size: int  # Rows of the embedding / logits (may exceed the tokenizer's size by padding rows).
  pad_token_id: int  # Fills outputs after EOS (and encoder inputs' padding for T5).

  @property
  def eos_token_ids(self) -> tuple[int, ...]: ...  # Every id that ends a sequence.

  def to_hf_dict(self) -> dict: ...  # The `config.json` that transformers reads back into this architecture.


def write_rows(buffer: jax.Array, block: jax.Array, offsets: jax.Array, axis: int = 0) -> jax.Array:
  """Each row's block written at its own offset: buffer [B, ...], block [B, ...] (the same rank), offsets [B];
  `axis` counts the row's own axes (0: the first after B). The one per-row write of caches and loop buffers.
  The caller leaves room: a start past the end would be silently shifted back by dynamic_update_slice."""
  return jax.vmap(lambda buf, blk, off: jax.lax.dynamic_update_slice_in_dim(buf, blk, off, axis=axis))(
      buffer, block, offsets)


def shapes_from_axes(axes: Any, size: dict[str, int]) -> Any:
  """The shape of every parameter from its logical axis names: `axes` a pytree of name tuples (a family's
  `param_axes`), `size` each name's length; returns the same pytree with tuples of ints."""
  return jax.tree.map(lambda names: tuple(size[a] for a in names), axes, is_leaf=lambda x: isinstance(x, tuple))
