"""The contract between model families and the decoding loop: `Decoder`, `DecoderCache` and `ModelConfig`.

The loop (jaxspec/decoding/) sees a model only through these types, as t5x's decoding sees only a
`tokens_to_logits` function and gemma's sampler a `TransformerLike`:

    out = decoder.prefill(params, input_ids, input_lengths, cache_len)  # encoder pass / prompt prefill: Prefilled
    res = decoder.step(params, out.cache, tokens)                       # [B, T] tokens at per-row offsets: StepResult
    cache = res.cache.rollback(positions)                               # per-row length change

One `step` serves chains and token trees (docs/trees.md), with or without the hidden states a feature head reads,
and one `prefill` gives the prompt's features (`layers=`) and an encoder-decoder's encoder output (`encoder=True`):

    res = decoder.step(params, cache, tokens, tree=TreeNodes(depths, ancestors), layers=(1, 2, 3))
    cache = res.cache.compact(base, path, path_len)                     # keep one root-to-leaf path

Positions. A cache counts absolute positions per row in `lengths` [B] and the positions that precede the loop's
first token in `offsets` [B]: 0 for an encoder-decoder (the decoder starts empty, the first token is its start
token), prompt length - 1 for a decoder-only model (the prompt but its last token is prefilled; that last token is
the first one the loop feeds). The loop thinks in `positions = lengths - offsets`, the number of its own tokens
already fed, and rolls back by setting them: `rollback(positions)` is `lengths = offsets + positions`. Keys and
values past `lengths` are stale: every family masks keys by position (a query at position t sees keys at
positions <= t), so they are never attended to and are overwritten by later writes.

Shape letters: B batch, S input (encoder or prompt) positions, T new positions fed in one call, V vocabulary,
N tree nodes fed in one call, D nodes on a kept path, C cache positions.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import jax
import jax.numpy as jnp
from flax import struct

C = TypeVar("C", bound="DecoderCache")


class CachePositions:
  """Mixin for `flax.struct.dataclass` caches with `lengths` and `offsets` fields: positions and rollback."""

  lengths: jax.Array  # [B] int32 absolute positions written.
  offsets: jax.Array  # [B] int32 positions before the loop's first token.
  # The cache's per-position arrays: field name -> the position axis of each array in that field (a tuple of
  # per-layer arrays, or one array). A family's cache sets it; `compact` moves those arrays' entries.
  position_fields: ClassVar[dict[str, int]]

  @property
  def positions(self) -> jax.Array:
    """[B] int32: the loop's tokens already fed (the first token included once fed)."""
    return self.lengths - self.offsets

  def rollback(self: C, positions: jax.Array) -> C:
    """The cache with `positions` [B] of the loop's tokens kept per row: a length change, nothing is copied."""
    return self.replace(lengths=self.offsets + positions)  # type: ignore[attr-defined]

  def compact(self: C, base: jax.Array, path: jax.Array, path_len: jax.Array) -> C:
    """Keeps one path of a tree fed by `Decoder.step(..., tree=...)`: the cache as if only that path had been fed.

    Node n of the tree sits at slot base + n. Per row, the keys and values of slots base + path[:, d] move to
    position base + d for d < path_len, and lengths becomes base + path_len (see `compact_rows`).

    Args:
      base: [B] int32 the lengths before the tree's step.
      path: [B, D] int32 node indices, root first (node 0, at slot base, stays in place); entries at
        d >= path_len are ignored (any value).
      path_len: [B] int32 nodes kept per row, in [0, D].
    """
    moved = {}
    for name, axis in type(self).position_fields.items():
      arrays = getattr(self, name)
      if isinstance(arrays, tuple):
        moved[name] = tuple(compact_rows(a, base, path, axis) for a in arrays)
      else:
        moved[name] = compact_rows(arrays, base, path, axis)
    return self.replace(lengths=base + path_len, **moved)  # type: ignore[attr-defined]


@struct.dataclass
class TreeNodes:
  """Token-tree nodes fed by one `Decoder.step` (EAGLE-2, SpecInfer; docs/trees.md): their depths and ancestors.

  Node n of the call sits at position cache.lengths - P + depths[:, P + n] and attends to the cached prefix and to
  the nodes m with ancestors[:, n, m] (itself included), P of which were fed by earlier calls of the same tree
  (P = 0: the whole tree in one call). Parents come before their children.
  """

  depths: jax.Array  # [B, P + N] int32: each node's depth (0: the root, the token a chain step would feed first).
  ancestors: jax.Array  # [B, N, P + N] bool: [b, n, m] True where node m is an ancestor of new node P + n or it.

  @classmethod
  def of(cls, depths: jax.Array, ancestors: jax.Array) -> "TreeNodes":
    """Depths as int32 and ancestors as bool (what every family computes with)."""
    return cls(depths=depths.astype(jnp.int32), ancestors=ancestors.astype(bool))


@struct.dataclass
class StepResult:
  """What `Decoder.step` returns."""

  logits: jax.Array  # [B, T, V] float32: position t predicts the token after tokens[:, t].
  features: jax.Array | None  # [B, T, len(layers) * D] the requested hidden states; None when layers == ().
  cache: Any  # The family's cache, `lengths` advanced by T.


@struct.dataclass
class Prefilled:
  """What `Decoder.prefill` returns."""

  cache: Any  # The family's cache with positions == 0.
  first: jax.Array  # [B] int32: the token the loop feeds first (T5's start token, a prompt's last token).
  features: jax.Array | None = None  # [B, S', len(layers) * D] (S' = S decoder-only, 0 for T5); None: layers ().
  # (encoded [B, S, D], mask [B, S] bool): an encoder-decoder's encoder output (encoder=True), else None.
  encoder: tuple[jax.Array, jax.Array] | None = None


@runtime_checkable
class DecoderCache(Protocol):
  """A family's decoder state: any pytree with per-row `lengths` and `offsets`, a `rollback` by length and a
  `compact` keeping one path of a tree (`CachePositions` gives both)."""

  lengths: jax.Array
  offsets: jax.Array

  @property
  def positions(self) -> jax.Array: ...

  def rollback(self: C, positions: jax.Array) -> C: ...

  def compact(self: C, base: jax.Array, path: jax.Array, path_len: jax.Array) -> C: ...


@runtime_checkable
class Decoder(Protocol):
  """The two calls a decoding loop makes of a model, for chains and token trees, with or without hidden states.
  Implementations are frozen dataclasses of a config: hashable, so that they are static arguments of the jitted
  loop. Every family implements all of it (the chain x tree x features x encoder options are keywords, not
  separate methods); `layers` and `tree` are static in kind (a tuple; None or a `TreeNodes`), so a call without
  them compiles exactly as a plain step.

  Features. Feature index i is the hidden state ENTERING decoder layer i, before its norm: 0 the token embedding
  (as the family scales it), num_feature_layers the final pre-norm output. This is transformers'
  `output_hidden_states` index (hidden_states[i], i < L); EAGLE-3's aux layer id j (specforge, sglang: the output
  of layer j) is i = j + 1.
  """

  @property
  def num_feature_layers(self) -> int: ...  # L: the largest feature index (decoder layers of the model).

  @property
  def feature_size(self) -> int: ...  # D: the width of one layer's feature.

  def prefill(self, params: Any, input_ids: jax.Array, input_lengths: jax.Array, cache_len: int, *,
              layers: tuple[int, ...] = (), encoder: bool = False) -> Prefilled:
    """Builds the cache from the inputs, before the loop's first token.

    Args:
      params: the family's parameter pytree.
      input_ids: [B, S] int32, right-padded (encoder inputs for T5, prompts for decoder-only models).
      input_lengths: [B] int32 real tokens per row (>= 1).
      cache_len: positions the loop may write per row from its first token on (its first token included).
      layers: feature indices to return for the positions processed (static; () collects nothing).
      encoder: also return an encoder-decoder's encoder output (run once: the cache's cross-attention keys and
        values come from the same output); a decoder-only family raises ValueError.
    Returns:
      `Prefilled`: the cache, the first tokens, the features [B, S', F] (S' = S for a decoder-only prompt, 0 for an
      encoder-decoder, whose decoder starts empty) or None, the encoder output or None.
    """
    ...

  def cache_axes(self) -> Any:
    """The logical axis names of every array of the cache `prefill` returns: the cache's pytree with a tuple of
    names in place of each array (`is_axes` tells the leaves). "batch" names the rows (what a slot engine gathers
    and writes per request, and what a mesh splits over `data`); the others ("heads", "kv_heads", "cache_seq",
    "kv", ...) map to mesh axes by `jaxspec.sharding.rules`. Declared, never found from shapes."""
    ...

  def step(self, params: Any, cache: DecoderCache, tokens: jax.Array, *, tree: TreeNodes | None = None,
           layers: tuple[int, ...] = ()) -> StepResult:
    """Feeds tokens [B, T] at each row's position `cache.lengths`: a chain (tree None), or T nodes of a token tree.

    Tree nodes: node n is at position cache.lengths - P + depths[:, P + n] (RoPE, sliding windows, relative
    position biases: all from positions), is written at slot cache.lengths + n (slot order = node order) and
    attends to the cached prefix and to its ancestors (`tree_attention`); `cache.compact(base, path, path_len)`
    then keeps one path. A chain (depths 0..T-1, ancestors lower-triangular) is the plain step. A node's features
    are those a plain step of its path computes at its last position.

    Returns:
      `StepResult`: logits [B, T, V] float32, features [B, T, len(layers) * D] or None, and the cache with the
      new keys and values written and `lengths` advanced by T. The caller leaves room: positions + T <= cache_len.
    """
    ...


@runtime_checkable
class HeadDecoder(Decoder, Protocol):
  """A feature head's model (EAGLE-3, `jaxspec.models.eagle3.Eagle3Head`): a `Decoder` whose `tokens` pair each
  token with the hidden state it reads (`eagle3.HeadInput`) and whose features are its pre-norm outputs, plus the
  calls only a head makes (params: the head's own parameters)."""

  def fuse(self, params: Any, features: jax.Array) -> jax.Array:
    """[B, T, H] the head's input from the target's features [B, T, F]."""
    ...

  def logits(self, params: Any, prenorm: jax.Array) -> jax.Array:
    """[B, T, V] float32 the logits of pre-norm outputs [B, T, H]."""
    ...

  def init_cache(self, batch: int, length: int, dtype: Any, encoder: Any = None) -> DecoderCache:
    """An empty cache (a T5 target's head: holding its encoder keys and values)."""
    ...

  def encoder_kv(self, params: Any, encoded: jax.Array, mask: jax.Array) -> Any:
    """A T5 target's head: its cross-attention keys and values of the encoder output [B, S, De]."""
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


def compact_rows(buffer: jax.Array, base: jax.Array, path: jax.Array, axis: int) -> jax.Array:
  """buffer [B, ..., C, ...] (positions on `axis`, counted with B) with, per row, the entries at base + path[:, d]
  moved to base + d for every d < D: one gather of D entries and one per-row write (`write_rows`).

  Entries past a row's kept length are written too (static shapes) but lie past its new length: stale, never
  attended to. Indices are clipped into the buffer, so padding in `path` is harmless. The caller leaves room:
  base + D <= C (a tree of N >= D nodes was written at base).

  Args:
    buffer: [B, ...] with C positions on `axis`; base: [B] int32; path: [B, D] int32 offsets from base.
  """
  src = base[:, None] + path  # [B, D] slots to read
  rows = jax.vmap(lambda buf, idx: jnp.take(buf, idx, axis=axis - 1, mode="clip"))(buffer, src)
  return write_rows(buffer, rows, base, axis=axis - 1)


def tree_attention(lengths: jax.Array, depths: jax.Array, ancestors: jax.Array, cache_len: int,
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Positions and the attention mask of N tree nodes written at slots lengths .. lengths + N - 1, after P nodes
  of the same tree fed by earlier calls at slots lengths - P .. lengths - 1 (P = 0: the whole tree in one call;
  P > 0: a drafter growing a tree depth by depth feeds each depth once, `Decoder.step`).

  Mask layout: one dense bool [B, N, C] (query node, cache slot), the key axis last and contiguous, the layout
  of the causal mask of a plain `step` of N tokens. It is built once per call (a gather of the [B, N, P + N]
  ancestor block into the slots the nodes occupy), shared by every layer and head, and enters attention as the
  same `where` on the scores, which XLA fuses into the softmax: a tree costs what a plain verify of N tokens costs.
  A layout that puts the key axis anywhere but last, or repeats the mask per head or head_dim (sglang-jax's
  TPU kernel did, 61x slower than causal until it stored keys on the lane axis), pays a transpose per block.
  A fused kernel (Pallas, FlashInfer) would instead take `lengths` for the prefix (no mask) and the small
  [B, N, N] block for the tree, as sglang's and vLLM's tree-attention backends do.

  Args:
    lengths: [B] int32 slots written before this call (the tree's first node at slot base = lengths - P).
    depths: [B, P + N] int32 depth of each tree node, earlier ones first (depth 0 sits at position base).
    ancestors: [B, N, P + N] bool, [b, n, m] True where tree node m is an ancestor of new node P + n or that node.
    cache_len: C, cache slots (static).
  Returns:
    query_pos [B, N] int32 (base + depths of the new nodes), key_pos [B, C] int32 (the position of the key in
    each slot: the slot itself for the prefix, base + depths[m] for tree node m; past the tree, the slot), and
    allowed [B, N, C] bool (prefix slots < base, and the slots of each node's ancestors). Windows (a key within W
    positions of its query) are the family's to add, from query_pos and key_pos.
  """
  n, total = ancestors.shape[1], ancestors.shape[2]
  base = lengths - (total - n)  # [B] the tree's first slot
  slots = jnp.arange(cache_len)  # [C]
  node = slots[None, :] - base[:, None]  # [B, C] tree node of each slot (in the tree where 0 <= node < P + N)
  in_tree = (node >= 0) & (node < total)
  node = jnp.clip(node, 0, total - 1)
  query_pos = base[:, None] + depths[:, total - n:]  # [B, N]
  key_pos = jnp.where(in_tree, base[:, None] + jnp.take_along_axis(depths, node, axis=1), slots[None, :])
  in_prefix = slots[None, :] < base[:, None]  # [B, C]
  tree_allowed = jnp.take_along_axis(ancestors, jnp.broadcast_to(node[:, None, :], (node.shape[0], n, cache_len)),
                                     axis=2)  # [B, N, C]
  allowed = in_prefix[:, None, :] | (in_tree[:, None, :] & tree_allowed)
  return query_pos, key_pos, allowed


def shapes_from_axes(axes: Any, size: dict[str, int]) -> Any:
  """The shape of every parameter from its logical axis names: `axes` a pytree of name tuples (a family's
  `param_axes`), `size` each name's length; returns the same pytree with tuples of ints."""
  return jax.tree.map(lambda names: tuple(size[a] for a in names), axes, is_leaf=lambda x: isinstance(x, tuple))


BATCH = "batch"  # The logical name of the rows in `Decoder.cache_axes` and `Drafter.state_axes`.


def is_axes(x: Any) -> bool:
  """True for a leaf of an axes pytree (`Decoder.cache_axes`): a tuple of logical names (() for a scalar)."""
  return isinstance(x, tuple) and all(isinstance(a, str) for a in x)


def batch_axes(axes_tree: Any) -> tuple[int | None, ...]:
  """Per array of an axes pytree (flatten order), the position of its "batch" axis, or None for an array shared
  by every row."""
  return tuple(names.index(BATCH) if BATCH in names else None
               for names in jax.tree.leaves(axes_tree, is_leaf=is_axes))


def with_rows(shapes: list, axes: tuple[int | None, ...], rows: int) -> list[jax.ShapeDtypeStruct]:
  """Each of `shapes` (flattened ShapeDtypeStructs, e.g. one row's cache) with its batch axis (`axes`, from
  `batch_axes`) `rows` long; an array shared by every row (None) unchanged."""
  return [jax.ShapeDtypeStruct(tuple(rows if d == axis else n for d, n in enumerate(s.shape)), s.dtype)
          for s, axis in zip(shapes, axes)]
