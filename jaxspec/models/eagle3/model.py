"""The EAGLE-3 head as pure functions: parameters are a plain pytree, its KV cache an explicit pytree.

    g = fuse(params, cfg, features)                                   # [B, T, 3 Ht] -> [B, T, H]
    cache = prefill(params, cfg, embed, features, input_ids, input_lengths, cache_len)
    logits, prenorm, cache = step(params, cfg, embed, cache, hidden, tokens)

Architecture (specforge's LlamaForCausalLMEagle3): `fc` (3 Ht -> H, no bias) fuses the target's three features
into g. One Llama decoder layer reads concat(input_norm(embed(token)), hidden_norm(g)) [.., 2H] into q, k and v
(the projections take 2H), with g as the attention's residual; then the gated MLP with its pre-norm and residual.
Its output is the "pre-norm hidden"; final_norm (unless norm_output is false) and lm_head (H -> draft vocabulary)
give the draft logits, mapped back to the target vocabulary by target_id = draft_id + d2t[draft_id].
A T5 target's head (cfg.cross_attention) adds one cross-attention sublayer to the target's encoder output between
the attention and the MLP (cross.py); its keys and values live in the cache (`Eagle3Cache.encoder`).

Alignment. The entry at position p pairs the target's feature of position p (the hidden states the target
computed while reading token p) with the embedding of token p + 1, and predicts token p + 2; RoPE uses p (the
reference's position_ids = arange over the feature positions). At later draft steps the head's own pre-norm output
at p stands in for the feature of p + 1: the entry at p + 1 is (prenorm_p, drafted token p + 2), predicting p + 3.
This is how SpecForge trains it (its test-time-training unroll: step i at index t uses position t + i, attends to
the target-feature keys at indices <= t and to its own earlier steps' keys at index t: a chain of cache entries).

The cache counts positions like the target's (`jaxspec.models.contract`): after `prefill` of a prompt of length
n, the head holds the n - 1 entries 0 .. n - 2 (the last pairs feature n - 2 with token n - 1), and `offsets` =
n - 1: the loop's first head entry is position n - 1, the target feature of the prompt's last token with the
first token the target emits. Rolling back is setting lengths (`rollback(positions)`), as in the target.

The embedding is the target's, frozen, raw (unscaled, even for a Gemma target): pass `embedding_table(params,
target_embedding)` as `embed`. Published heads may omit embed_tokens; when present it is `params["embedding"]`.

Shape letters: B batch, S input positions, T new entries, C cache positions, N query heads, K key/value heads,
Hd head_dim, H hidden, Ht target feature width, F intermediate, V target vocabulary, Vd draft vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspec.models.contract import (CachePositions, Prefilled, StepResult, TreeNodes, shapes_from_axes,
                                     tree_attention, write_rows)
from jaxspec.models.decoder_only import layers
from jaxspec.models.eagle3 import cross
from jaxspec.models.eagle3.config import Eagle3Config


@struct.dataclass
class Eagle3Cache(CachePositions):
  """Keys and values of the head's one layer (`jaxspec.models.contract.DecoderCache`)."""

  k: jax.Array  # [B, C, K, Hd] post-RoPE keys, written in place at per-row positions.
  v: jax.Array  # [B, C, K, Hd]
  lengths: jax.Array  # [B] int32 entries written per row.
  offsets: jax.Array  # [B] int32 prompt length - 1: the loop's first entry's position.
  # A T5 target's head (cfg.cross_attention): cross.EncoderKV, its cross-attention keys and values of the
  # target's encoder output, set once by the drafter's init and never rolled back. None for a decoder-only head.
  encoder: Any = None

  @property
  def max_length(self) -> int:
    return self.k.shape[1]


def param_axes(cfg: Eagle3Config, with_embedding: bool = False) -> dict:
  """Logical axis names of every parameter (the structure of `init_params`). d2t [Vd] int32 and t2d [V] bool are
  the vocabulary maps (not trained: leave them out of gradients)."""
  axes = {
      "fc": ("features", "embed"),
      "input_norm": ("embed",), "hidden_norm": ("embed",),
      "attention": {"q": ("embed2", "heads", "kv"), "k": ("embed2", "kv_heads", "kv"),
                    "v": ("embed2", "kv_heads", "kv"), "o": ("heads", "kv", "embed")},
      "mlp_norm": ("embed",),
      "mlp": {"gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed")},
      "final_norm": ("embed",),
      "lm_head": ("embed", "draft_vocab"),
      "d2t": ("draft_vocab",),
      "t2d": ("vocab",),
  }
  if cfg.fc_norm:
    axes["fc_norm"] = ("three", "target_embed")
  if with_embedding:
    axes["embedding"] = ("vocab", "embed")
  if cfg.cross_attention:
    axes.update(cross.param_axes(cfg))
  return axes


def param_shapes(cfg: Eagle3Config, with_embedding: bool = False) -> dict:
  """The shape of every parameter, as a pytree of tuples matching `param_axes`."""
  size = {"features": cfg.num_features * cfg.target_hidden_size, "embed": cfg.hidden_size,
          "embed2": 2 * cfg.hidden_size, "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "kv": cfg.head_dim,
          "mlp": cfg.intermediate_size, "draft_vocab": cfg.draft_vocab_size, "vocab": cfg.vocab_size,
          "three": cfg.num_features, "target_embed": cfg.target_hidden_size,
          "encoder_embed": cfg.encoder_hidden_size or 0}
  return shapes_from_axes(param_axes(cfg, with_embedding), size)


def vocab_maps(draft_to_target: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(d2t [Vd] int32, t2d [V] bool) of a draft vocabulary given as its target ids [Vd] (distinct, ascending in
  the published heads)."""
  ids = np.asarray(draft_to_target, np.int64)
  t2d = np.zeros((vocab_size,), np.bool_)
  t2d[ids] = True
  return (ids - np.arange(ids.shape[0])).astype(np.int32), t2d


def init_params(cfg: Eagle3Config, key: jax.Array, dtype=jnp.float32, std: float = 0.02,
                with_embedding: bool = False) -> dict:
  """Random weights N(0, std), norms the identity, and a random draft vocabulary (Vd distinct target ids)."""
  shapes = param_shapes(cfg, with_embedding)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
  keys = jax.random.split(key, len(leaves) + 1)
  out = []
  for k, (path, shape) in zip(keys, leaves):
    name = path[-1].key
    if name.endswith("norm"):
      out.append(jnp.ones(shape, dtype))
    else:
      out.append((jax.random.normal(k, shape, jnp.float32) * std).astype(dtype))
  params = jax.tree_util.tree_unflatten(treedef, out)
  ids = np.sort(np.asarray(jax.random.permutation(keys[-1], cfg.vocab_size)[:cfg.draft_vocab_size]))
  d2t, t2d = vocab_maps(ids, cfg.vocab_size)
  return {**params, "d2t": jnp.asarray(d2t), "t2d": jnp.asarray(t2d)}


def embedding_table(params: dict, target_embedding: jax.Array) -> jax.Array:
  """[V, H] the table the head embeds tokens with: its own embed_tokens when the file has one, else the target's
  (raw, as stored: a Gemma target's sqrt(H) scaling is not applied)."""
  return params.get("embedding", target_embedding)


def cache_axes(cfg: Eagle3Config) -> Eagle3Cache:
  """Logical axis names of the cache's arrays (an Eagle3Cache of name tuples); a T5 target's head
  (cfg.cross_attention) also holds its encoder keys and values."""
  kv = ("batch", "cache_seq", "kv_heads", "kv")
  encoder = None
  if cfg.cross_attention:
    keys = ("batch", "encoder_seq", "kv_heads", "kv")
    encoder = cross.EncoderKV(k=keys, v=keys, mask=("batch", "encoder_seq"))
  return Eagle3Cache(k=kv, v=kv, lengths=("batch",), offsets=("batch",), encoder=encoder)


def init_cache(cfg: Eagle3Config, batch: int, length: int, dtype,
               encoder: cross.EncoderKV | None = None) -> Eagle3Cache:
  """An empty cache of `length` positions per row (lengths and offsets 0); a T5 target's head keeps its
  encoder keys and values (`cross.encoder_kv`) in it."""
  shape = (batch, length, cfg.num_kv_heads, cfg.head_dim)
  zeros = jnp.zeros((batch,), jnp.int32)
  return Eagle3Cache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), lengths=zeros, offsets=zeros,
                     encoder=encoder)


def _norm(cfg: Eagle3Config, x: jax.Array, scale: jax.Array) -> jax.Array:
  return layers.rms_norm(x, scale, cfg.rms_norm_eps, 0.0)


def fuse(params: dict, cfg: Eagle3Config, features: jax.Array) -> jax.Array:
  """g [B, T, H]: `fc` of the concatenated target features [B, T, 3 Ht] (each chunk RMS-normed first when
  cfg.fc_norm)."""
  if cfg.fc_norm:
    chunks = jnp.split(features, cfg.num_features, axis=-1)
    features = jnp.concatenate([_norm(cfg, c, s) for c, s in zip(chunks, params["fc_norm"])], axis=-1)
  return features @ params["fc"]


def attention_inputs(params: dict, cfg: Eagle3Config, embed: jax.Array, hidden: jax.Array, tokens: jax.Array,
                     positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The layer's queries [B, T, N, Hd], keys and values [B, T, K, Hd] (q and k rotated at `positions` [B, T])
  from concat(input_norm(embed(tokens)), hidden_norm(hidden)) [B, T, 2H]. hidden [B, T, H], tokens [B, T] int."""
  e = jnp.take(embed, tokens, axis=0).astype(hidden.dtype)  # [B, T, H]
  x = jnp.concatenate([_norm(cfg, e, params["input_norm"]), _norm(cfg, hidden, params["hidden_norm"])], axis=-1)
  a = params["attention"]
  cos, sin = layers.rope_angles(cfg.rope, cfg.head_dim, positions)
  q = layers.apply_rope(layers.project(x, a["q"]), cos, sin)  # [B, T, N, Hd]
  k = layers.apply_rope(layers.project(x, a["k"]), cos, sin)  # [B, T, K, Hd]
  return q, k, layers.project(x, a["v"])


def layer_output(params: dict, cfg: Eagle3Config, hidden: jax.Array, attended: jax.Array,
                 encoder: cross.EncoderKV | None = None) -> jax.Array:
  """The pre-norm output [B, T, H]: `hidden` (the attention's residual) plus the projected attention output
  `attended` [B, T, N, Hd], then (a T5 target's head: `encoder` given) the cross-attention sublayer
  (`cross.attend`), then the gated MLP with its pre-norm and residual."""
  h = hidden + layers.output_projection(attended, params["attention"]["o"])
  if encoder is not None:
    h = cross.attend(params, cfg, h, encoder)
  return h + layers.gated_mlp(params["mlp"], _norm(cfg, h, params["mlp_norm"]), cfg.activation)


def _layer(params: dict, cfg: Eagle3Config, embed: jax.Array, cache: Eagle3Cache, hidden: jax.Array,
           tokens: jax.Array, key_len: int) -> tuple[jax.Array, Eagle3Cache]:
  """The decoder layer over T entries at positions cache.lengths: (pre-norm output [B, T, H], cache)."""
  if cfg.cross_attention and cache.encoder is None:
    raise ValueError("a T5 target's head (encoder_hidden_size set) needs its encoder keys and values in its cache: "
                     "init_cache(..., encoder=cross.encoder_kv(params, cfg, encoded, mask)).")
  starts = cache.lengths
  positions = starts[:, None] + jnp.arange(tokens.shape[1])[None, :]  # [B, T]
  q, k, v = attention_inputs(params, cfg, embed, hidden, tokens, positions)
  ks, vs = write_rows(cache.k, k, starts), write_rows(cache.v, v, starts)
  allowed = layers.attention_mask(positions, jnp.arange(key_len), None)  # [B, 1, 1, T, C]
  o = layers.attend(q, ks[:, :key_len], vs[:, :key_len], allowed, cfg.head_dim ** -0.5, None)
  out = layer_output(params, cfg, hidden, o, cache.encoder)
  return out, cache.replace(k=ks, v=vs, lengths=starts + tokens.shape[1])


def draft_logits(params: dict, cfg: Eagle3Config, prenorm: jax.Array) -> jax.Array:
  """[B, T, Vd] float32 logits over the draft vocabulary from the pre-norm output [B, T, H]."""
  x = _norm(cfg, prenorm, params["final_norm"]) if cfg.norm_output else prenorm
  return (x @ params["lm_head"]).astype(jnp.float32)


def to_target_vocab(params: dict, logits: jax.Array, vocab_size: int) -> jax.Array:
  """Draft logits [B, T, Vd] scattered to the target vocabulary [B, T, V]: column d goes to d + d2t[d], every
  other column is -inf (so softmax gives q = 0 outside the draft vocabulary)."""
  target_ids = jnp.arange(params["d2t"].shape[0], dtype=jnp.int32) + params["d2t"]  # [Vd]
  full = jnp.full(logits.shape[:-1] + (vocab_size,), -jnp.inf, logits.dtype)
  return full.at[..., target_ids].set(logits, unique_indices=True)


def feed(params: dict, cfg: Eagle3Config, embed: jax.Array, cache: Eagle3Cache, hidden: jax.Array,
         tokens: jax.Array) -> tuple[jax.Array, Eagle3Cache]:
  """`step` without the logits: writes T entries (hidden [B, T, H], tokens [B, T]) at positions cache.lengths and
  returns (prenorm_hidden [B, T, H], cache advanced by T). For entries whose logits nobody reads (a drafter
  re-feeding verified positions with the target's features)."""
  return _layer(params, cfg, embed, cache, hidden, tokens, cache.max_length)


def logits(params: dict, cfg: Eagle3Config, prenorm: jax.Array) -> jax.Array:
  """[B, T, V] float32 logits over the TARGET vocabulary (-inf outside the draft vocabulary) from the pre-norm
  output [B, T, H] of `feed` / `step`."""
  return to_target_vocab(params, draft_logits(params, cfg, prenorm), cfg.vocab_size)


def step(params: dict, cfg: Eagle3Config, embed: jax.Array, cache: Eagle3Cache, hidden: jax.Array,
         tokens: jax.Array) -> tuple[jax.Array, jax.Array, Eagle3Cache]:
  """Feeds T entries per row at that row's positions cache.lengths .. + T - 1.

  Entry t is (hidden[:, t], tokens[:, t]): the fused target feature g of position p (`fuse`), or the head's own
  pre-norm output at p - 1 at later draft steps, with the token at p + 1. Inputs are per entry, so a tree drafter
  can feed any mix of fused features and pre-norm outputs (a tree's nodes, with their ancestor mask and per-node
  positions: `step_tree`). The caller leaves room: lengths + T <= cache.max_length.

  Args:
    embed: [V, H] the embedding table (`embedding_table`).
    hidden: [B, T, H]; tokens: [B, T] int.
  Returns:
    logits [B, T, V] float32 over the TARGET vocabulary, -inf outside the draft vocabulary (entry t predicts
    the token two past its feature's position), prenorm_hidden [B, T, H] (the next draft step's `hidden`), and
    the cache with lengths advanced by T.
  """
  prenorm, cache = feed(params, cfg, embed, cache, hidden, tokens)
  return logits(params, cfg, prenorm), prenorm, cache


def step_tree(params: dict, cfg: Eagle3Config, embed: jax.Array, cache: Eagle3Cache, hidden: jax.Array,
              tokens: jax.Array, depths: jax.Array, ancestors: jax.Array
              ) -> tuple[jax.Array, jax.Array, Eagle3Cache]:
  """`step` over T entries that are nodes of a token tree (`jaxspec.models.contract.TreeDecoder.step_tree`'s
  layout): entry t sits at position cache.lengths - P + depths[:, P + t] (its RoPE angle), is written at slot
  cache.lengths + t, and attends to the cached entries before the tree (slots < cache.lengths - P) and to the
  tree's entries m with ancestors[:, t, m] (itself included), P of which were fed by earlier calls at slots
  cache.lengths - P .. cache.lengths - 1 (`contract.tree_attention`). A chain (P = 0, depths 0..T-1,
  ancestors lower-triangular) is `step`. A head drafting a tree feeds each depth's beam once: its entries pair
  the pre-norm output of their parent's entry with their own token (docs/trees.md, "Trees from a feature head").

  Args:
    hidden: [B, T, H]; tokens: [B, T] int; depths: [B, P + T] int32; ancestors: [B, T, P + T] bool.
  Returns:
    logits [B, T, V] float32 over the TARGET vocabulary (-inf outside the draft vocabulary), prenorm_hidden
    [B, T, H], and the cache with lengths advanced by T (the caller leaves room: lengths + T <= max_length).
  """
  starts = cache.lengths
  positions, _, allowed = tree_attention(starts, depths.astype(jnp.int32), ancestors.astype(bool),
                                         cache.max_length)  # [B, T], [B, T, C]
  q, k, v = attention_inputs(params, cfg, embed, hidden, tokens, positions)
  ks, vs = write_rows(cache.k, k, starts), write_rows(cache.v, v, starts)
  o = layers.attend(q, ks, vs, allowed[:, None, None], cfg.head_dim ** -0.5, None)
  prenorm = layer_output(params, cfg, hidden, o, cache.encoder)  # (a T5 target's head: its cross-attention)
  cache = cache.replace(k=ks, v=vs, lengths=starts + tokens.shape[1])
  return logits(params, cfg, prenorm), prenorm, cache


def prefill(params: dict, cfg: Eagle3Config, embed: jax.Array, features: jax.Array, input_ids: jax.Array,
            input_lengths: jax.Array, cache_len: int, encoder: cross.EncoderKV | None = None) -> Eagle3Cache:
  """Writes the prompt's entries in one call: entry s pairs features[:, s] with input_ids[:, s + 1].

  Args:
    features: [B, S, 3 Ht] the target's features of the prompt positions (`prefill_features` of the target).
    input_ids: [B, S] int right-padded prompts; input_lengths: [B] int32 (>= 1).
    cache_len: positions the loop may write per row from its first entry on.
  Returns:
    a cache of S + cache_len positions holding entries 0 .. len - 2 (lengths = offsets = len - 1). The entries
    the call also computed at s >= len - 1 (padding tokens) are stale: masked and overwritten by later steps.
  """
  return prefill_hidden(params, cfg, embed, features, input_ids, input_lengths, cache_len, encoder)[0]


def prefill_hidden(params: dict, cfg: Eagle3Config, embed: jax.Array, features: jax.Array, input_ids: jax.Array,
                   input_lengths: jax.Array, cache_len: int,
                   encoder: cross.EncoderKV | None = None) -> tuple[Eagle3Cache, jax.Array]:
  """`prefill` that also returns the pre-norm outputs [B, S, H] of the S entries it computed: entry len - 2's
  gives the logits of the token after the prompt (`logits`), without a step."""
  batch, width = input_ids.shape
  next_tokens = jnp.concatenate([input_ids[:, 1:], jnp.zeros((batch, 1), input_ids.dtype)], axis=1)  # [B, S]
  g = fuse(params, cfg, features)
  cache = init_cache(cfg, batch, width + cache_len, g.dtype, encoder)
  prenorm, cache = _layer(params, cfg, embed, cache, g, next_tokens, width)
  last = (input_lengths - 1).astype(jnp.int32)
  return cache.replace(lengths=last, offsets=last), prenorm


@struct.dataclass
class HeadInput:
  """What one head call feeds per entry (the head's `tokens` in the `contract.Decoder` calls): entry t pairs
  hidden[:, t] (a fused target feature g of position p, `fuse`, or the head's own pre-norm output at p - 1) with
  the token tokens[:, t] at position p + 1 (prefill: entry s pairs hidden[:, s] with tokens[:, s + 1])."""

  tokens: jax.Array  # [B, T] int
  hidden: jax.Array  # [B, T, H]


@dataclasses.dataclass(frozen=True)
class Eagle3Head:
  """The head bound to its config (hashable: a static argument), behind `contract.Decoder` (its `params` are
  {"head": the head's parameters, "embed": [V, H] the table it embeds tokens with, `embedding_table`}; its
  `tokens` a `HeadInput`; its features its pre-norm output) plus the calls only a head makes:

      out = head.prefill(params, HeadInput(ids, head.fuse(hp, features)), lengths, cache_len)  # Prefilled
      res = head.step(params, cache, HeadInput(tokens, hidden), tree=None)                     # StepResult
      res.logits [B, T, V], res.features [B, T, H] (pre-norm outputs: the next draft step's hidden), res.cache
      g = head.fuse(hp, features)                                        # [B, T, 3 Ht] -> [B, T, H]
      logits = head.logits(hp, prenorm)                                  # the logits of given pre-norm outputs
      cache = head.init_cache(batch, length, dtype, encoder=head.encoder_kv(hp, encoded, mask))  # empty
  """

  config: Eagle3Config

  @property
  def num_feature_layers(self) -> int:
    """One layer: its pre-norm output is the head's only feature."""
    return 1

  @property
  def feature_size(self) -> int:
    """H: the width of the pre-norm output."""
    return self.config.hidden_size

  def cache_axes(self) -> Eagle3Cache:
    """Logical axis names of the cache's arrays (`cache_axes`)."""
    return cache_axes(self.config)

  def prefill(self, params: dict, input_ids: HeadInput, input_lengths: jax.Array, cache_len: int, *,
              layers: tuple[int, ...] = (), encoder: bool = False) -> Prefilled:
    """The prompt's entries in one call (`prefill_hidden`): entry s pairs input_ids.hidden[:, s] (the fused
    target feature of prompt position s) with input_ids.tokens[:, s + 1]. Returns the cache (lengths = offsets
    = len - 1), first = each prompt's last token, and features = the pre-norm outputs [B, S, H] of the S entries
    (entry len - 2's give the logits of the token after the prompt). `layers` is ignored (one layer); a head has
    no encoder output (a T5 target's head starts empty: `init_cache` with its `encoder_kv`)."""
    del layers
    if encoder:
      raise ValueError("an EAGLE-3 head has no encoder output of its own (its T5 cross-attention reads the "
                       "target's: init_cache(..., encoder=encoder_kv(...))).")
    head, embed = params["head"], params["embed"]
    batch, width = input_ids.tokens.shape
    ids = input_ids.tokens
    next_tokens = jnp.concatenate([ids[:, 1:], jnp.zeros((batch, 1), ids.dtype)], axis=1)  # [B, S]
    g = input_ids.hidden
    cache = init_cache(self.config, batch, width + cache_len, g.dtype)
    prenorm, cache = _layer(head, self.config, embed, cache, g, next_tokens, width)
    last = (input_lengths - 1).astype(jnp.int32)
    first = jnp.take_along_axis(ids, last[:, None], axis=1)[:, 0].astype(jnp.int32)
    return Prefilled(cache=cache.replace(lengths=last, offsets=last), first=first, features=prenorm)

  def step(self, params: dict, cache: Eagle3Cache, tokens: HeadInput, *, tree: TreeNodes | None = None,
           layers: tuple[int, ...] = ()) -> StepResult:
    """T entries per row (`step`; tree nodes with `tree`: `step_tree`): logits [B, T, V] over the TARGET
    vocabulary (-inf outside the draft vocabulary), features = the pre-norm outputs [B, T, H], the cache advanced
    by T. `layers` is ignored (the pre-norm output is always returned; unread logits compile away)."""
    del layers
    head, embed = params["head"], params["embed"]
    if tree is None:
      logits_, prenorm, cache = step(head, self.config, embed, cache, tokens.hidden, tokens.tokens)
    else:
      logits_, prenorm, cache = step_tree(head, self.config, embed, cache, tokens.hidden, tokens.tokens,
                                          tree.depths, tree.ancestors)
    return StepResult(logits=logits_, features=prenorm, cache=cache)

  def fuse(self, params: dict, features: jax.Array) -> jax.Array:
    """g [B, T, H] from the target's features [B, T, 3 Ht] (`fuse`); params: the head's own."""
    return fuse(params, self.config, features)

  def logits(self, params: dict, prenorm: jax.Array) -> jax.Array:
    """[B, T, V] the target-vocabulary logits of pre-norm outputs [B, T, H] (`logits`); params: the head's own."""
    return logits(params, self.config, prenorm)

  def init_cache(self, batch: int, length: int, dtype, encoder: cross.EncoderKV | None = None) -> Eagle3Cache:
    """An empty cache (`init_cache`)."""
    return init_cache(self.config, batch, length, dtype, encoder)

  def encoder_kv(self, params: dict, encoded: jax.Array, mask: jax.Array) -> cross.EncoderKV:
    """A T5 target's head: its cross-attention keys and values of the encoder output [B, S, De] (once per input)."""
    return cross.encoder_kv(params, self.config, encoded, mask)
