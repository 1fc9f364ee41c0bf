"""A functional decoder-only transformer: parameters are a plain pytree, the KV cache an explicit pytree.

    params = init_params(config, key)
    cache = init_cache(config, batch, max_len, dtype)
    logits, cache = decode(params, config, cache, tokens)  # tokens [B, T] at per-row positions cache.lengths

`decode` writes the T new positions of every row at that row's `cache.lengths`, with RoPE at those positions, and
advances it by T. Masks derive from positions (a query at position t sees keys at positions <= t, and > t - W in a
sliding-window layer), so setting `lengths` back is a complete rollback: stale keys beyond it are never attended
to and are overwritten by later writes.

Sliding-window layers keep a full-length cache and mask by window (no ring buffer). Rolling back is then a length
change only, and it is safe: every stale key sits at a position beyond the query that could see it, and is
overwritten before a query at its position exists. A ring buffer of W slots would save memory on long contexts
but a rollback would have to restore the keys that the rejected drafts overwrote.

Shape letters: B batch, S prompt positions, T new positions, C cache positions, L layers, N query heads, K key/value
heads, H head_dim, D hidden, F intermediate, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.models.contract import (CachePositions, Prefilled, StepResult, TreeNodes, check_feature_layers,
                                     shapes_from_axes, tree_attention, write_rows)
from jaxspec.models.decoder_only import layers
from jaxspec.models.decoder_only.config import DecoderOnlyConfig


@struct.dataclass
class DecoderOnlyCache(CachePositions):
  """Keys and values of every layer (`jaxspec.models.contract.DecoderCache`)."""

  position_fields = {"k": 1, "v": 1}  # For `compact`: positions are axis 1 of every [B, C, K, H] array.

  # One [B, C, K, H] array per layer, written in place at per-row offsets (post-RoPE keys).
  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  lengths: jax.Array  # [B] int32 positions written per row.
  offsets: jax.Array  # [B] int32 prompt length - 1: the loop's first token is the prompt's last one.

  @property
  def max_length(self) -> int:
    return self.k[0].shape[1]


def cache_axes(cfg: DecoderOnlyConfig) -> DecoderOnlyCache:
  """Logical axis names of every cache array, a DecoderOnlyCache of name tuples (see t5.cache_axes)."""
  per_layer = tuple(("batch", "cache_seq", "kv_heads", "kv") for _ in range(cfg.num_layers))
  return DecoderOnlyCache(k=per_layer, v=per_layer, lengths=("batch",), offsets=("batch",))


def _layer_axes(cfg: DecoderOnlyConfig) -> dict:
  attention = {"q": ("embed", "heads", "kv"), "k": ("embed", "kv_heads", "kv"), "v": ("embed", "kv_heads", "kv"),
               "o": ("heads", "kv", "embed")}
  if cfg.qkv_bias:
    attention.update(q_bias=("heads", "kv"), k_bias=("kv_heads", "kv"), v_bias=("kv_heads", "kv"))
  if cfg.o_bias:
    attention["o_bias"] = ("embed",)
  if cfg.qk_norm:
    attention.update(q_norm=("kv",), k_norm=("kv",))
  layer = {"attention_norm": ("embed",), "attention": attention, "mlp_norm": ("embed",),
           "mlp": {"gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed")}}
  if cfg.sandwich_norms:
    layer.update(post_attention_norm=("embed",), post_mlp_norm=("embed",))
  return layer


def param_axes(cfg: DecoderOnlyConfig) -> dict:
  """Logical axis names of every parameter: a pytree with the structure of `init_params(cfg, ...)`."""
  axes = {"embedding": ("vocab", "embed"), "layers": [_layer_axes(cfg) for _ in range(cfg.num_layers)],
          "final_norm": ("embed",)}
  if not cfg.tie_word_embeddings:
    axes["lm_head"] = ("embed", "vocab")
  return axes


def param_shapes(cfg: DecoderOnlyConfig) -> dict:
  """The shape of every parameter, as a pytree of tuples matching `param_axes(cfg)`."""
  size = {"vocab": cfg.vocab_size, "embed": cfg.hidden_size, "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads,
          "kv": cfg.head_dim, "mlp": cfg.intermediate_size}
  return shapes_from_axes(param_axes(cfg), size)


def init_params(cfg: DecoderOnlyConfig, key: jax.Array, dtype=jnp.float32, std: float = 0.02) -> dict:
  """Random parameters as transformers initialises them: weights N(0, std), biases 0, norms the identity."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
  out = []
  for k, (path, shape) in zip(jax.random.split(key, len(leaves)), leaves):
    name = path[-1].key
    if name.endswith("norm"):
      out.append(jnp.full(shape, 1.0 - cfg.norm_offset, dtype))
    elif name.endswith("bias"):
      out.append(jnp.zeros(shape, dtype))
    else:
      out.append((jax.random.normal(k, shape, jnp.float32) * std).astype(dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def init_cache(cfg: DecoderOnlyConfig, batch: int, length: int, dtype) -> DecoderOnlyCache:
  """An empty cache of `length` positions per row (lengths and offsets 0)."""
  shape = (batch, length, cfg.num_kv_heads, cfg.head_dim)
  def empty():  # Distinct arrays for K and V: a donated cache must not hold one buffer twice.
    return tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
  zeros = jnp.zeros((batch,), jnp.int32)
  return DecoderOnlyCache(k=empty(), v=empty(), lengths=zeros, offsets=zeros)


def _norm(cfg: DecoderOnlyConfig, x: jax.Array, scale: jax.Array) -> jax.Array:
  return layers.rms_norm(x, scale, cfg.rms_norm_eps, cfg.norm_offset)


def _attention(cfg: DecoderOnlyConfig, a: dict, h: jax.Array, rope: tuple[jax.Array, jax.Array]):
  """q [B, T, N, H], k, v [B, T, K, H] of one layer, with biases, q/k norms and RoPE."""
  q = layers.project(h, a["q"], a.get("q_bias"))
  k = layers.project(h, a["k"], a.get("k_bias"))
  v = layers.project(h, a["v"], a.get("v_bias"))
  if cfg.qk_norm:
    q, k = _norm(cfg, q, a["q_norm"]), _norm(cfg, k, a["k_norm"])
  return layers.apply_rope(q, *rope), layers.apply_rope(k, *rope), v


def _tree_masks(cfg: DecoderOnlyConfig, starts: jax.Array, key_len: int, depths: jax.Array,
                ancestors: jax.Array) -> tuple[jax.Array, dict]:
  """query_pos [B, N] and the masks ({window: [B, 1, 1, N, C] bool}) of a tree written at slots starts + n.

  The layout is the one `attention_mask` gives a plain step (see `contract.tree_attention`); a sliding window
  compares positions, not slots: a node at depth d sees keys at positions > starts + d - W.
  """
  query_pos, key_pos, allowed = tree_attention(starts, depths, ancestors, key_len)
  masks = {None: allowed[:, None, None]}
  if cfg.sliding_window is not None:
    inside = key_pos[:, None, :] > query_pos[:, :, None] - cfg.sliding_window  # [B, N, C]
    masks[cfg.sliding_window] = (allowed & inside)[:, None, None]
  return query_pos, masks


def _run(params: dict, cfg: DecoderOnlyConfig, cache: DecoderOnlyCache, tokens: jax.Array, key_len: int,
         with_logits: bool, feature_layers: tuple[int, ...] = (), tree: tuple[jax.Array, jax.Array] | None = None
         ) -> tuple[jax.Array | None, jax.Array | None, DecoderOnlyCache]:
  """Feeds tokens [B, T] at positions cache.lengths; attends over the first key_len cache positions.

  Returns (logits [B, T, V] or None, features [B, T, len(feature_layers) * D] or None, cache). Features are the
  hidden states entering the decoder layers `feature_layers` (a static tuple; () collects nothing and adds no
  operation to the computation). `tree` (depths [B, T], ancestors [B, T, T]) feeds the tokens as tree nodes
  (`CausalDecoder.step`'s `tree`); None is the plain causal step, whose computation it leaves untouched.
  """
  starts = cache.lengths
  if tree is None:
    query_pos = starts[:, None] + jnp.arange(tokens.shape[1])  # [B, T]
    key_pos = jnp.arange(key_len)
    masks = {None: layers.attention_mask(query_pos, key_pos, None)}
    if cfg.sliding_window is not None:
      masks[cfg.sliding_window] = layers.attention_mask(query_pos, key_pos, cfg.sliding_window)
  else:
    query_pos, masks = _tree_masks(cfg, starts, key_len, *tree)
  ropes = {r: layers.rope_angles(r, cfg.head_dim, query_pos) for r in {cfg.rope_of(i) for i in range(cfg.num_layers)}}
  embedding = params["embedding"]
  x = jnp.take(embedding, tokens, axis=0)  # [B, T, D]
  if cfg.scale_embeddings:  # sqrt(hidden) rounded to the parameter dtype first, as transformers does.
    x = x * jnp.asarray(math.sqrt(cfg.hidden_size), embedding.dtype)
  ks, vs = list(cache.k), list(cache.v)
  entering = {}  # Layer index -> hidden state [B, T, D] entering it (only the layers asked for).
  for i, lp in enumerate(params["layers"]):
    if i in feature_layers:
      entering[i] = x
    sliding = cfg.is_sliding(i)
    q, k, v = _attention(cfg, lp["attention"], _norm(cfg, x, lp["attention_norm"]), ropes[cfg.rope_of(i)])
    ks[i], vs[i] = write_rows(ks[i], k, starts), write_rows(vs[i], v, starts)
    o = layers.attend(q, ks[i][:, :key_len], vs[i][:, :key_len], masks[cfg.sliding_window if sliding else None],
                      cfg.attention_scale, cfg.attn_logit_softcap)
    o = layers.output_projection(o, lp["attention"]["o"], lp["attention"].get("o_bias"))
    x = x + (_norm(cfg, o, lp["post_attention_norm"]) if cfg.sandwich_norms else o)
    h = layers.gated_mlp(lp["mlp"], _norm(cfg, x, lp["mlp_norm"]), cfg.activation)
    x = x + (_norm(cfg, h, lp["post_mlp_norm"]) if cfg.sandwich_norms else h)
  cache = cache.replace(k=tuple(ks), v=tuple(vs), lengths=starts + tokens.shape[1])
  features = None
  if feature_layers:
    entering[cfg.num_layers] = x  # The final pre-norm output: "the input of layer L".
    features = jnp.concatenate([entering[i] for i in feature_layers], axis=-1)
  if not with_logits:
    return None, features, cache
  x = _norm(cfg, x, params["final_norm"])
  if cfg.tie_word_embeddings:
    logits = jnp.einsum("btd,vd->btv", x, embedding)
  else:
    logits = jnp.einsum("btd,dv->btv", x, params["lm_head"])
  return layers.softcap(logits.astype(jnp.float32), cfg.final_logit_softcap), features, cache


def decode(params: dict, cfg: DecoderOnlyConfig, cache: DecoderOnlyCache,
           tokens: jax.Array) -> tuple[jax.Array, DecoderOnlyCache]:
  """Feeds T tokens per row at that row's position `cache.lengths`.

  The caller must leave room: lengths + T <= cache.max_length (dynamic_update_slice would silently shift a
  write that runs past the end).

  Args:
    tokens: [B, T] int token ids.
  Returns:
    logits [B, T, V] float32 (position t predicts the token after tokens[:, t]) and the cache with the new keys
    and values written and lengths advanced by T.
  """
  logits, _, cache = _run(params, cfg, cache, tokens, cache.max_length, with_logits=True)
  return logits, cache


def prefill(params: dict, cfg: DecoderOnlyConfig, input_ids: jax.Array, input_lengths: jax.Array,
            cache_len: int) -> tuple[DecoderOnlyCache, jax.Array]:
  """Writes right-padded prompts [B, S] in one call; returns (cache, each prompt's last token [B]).

  Keys and values go to positions 0..S-1 of a cache of S + cache_len positions. Positions past a row's length
  hold the padding's keys: never attended to (a query at t sees keys <= t, all rewritten by then). The cache
  keeps len - 1 positions: the last prompt token is the loop's first token, fed again at position len - 1.
  """
  cache, first, _ = _prefill(params, cfg, input_ids, input_lengths, cache_len, ())
  return cache, first


def _prefill(params: dict, cfg: DecoderOnlyConfig, input_ids: jax.Array, input_lengths: jax.Array, cache_len: int,
             feature_layers: tuple[int, ...]) -> tuple[DecoderOnlyCache, jax.Array, jax.Array | None]:
  batch, width = input_ids.shape
  cache = init_cache(cfg, batch, width + cache_len, params["embedding"].dtype)
  _, features, cache = _run(params, cfg, cache, input_ids, width, with_logits=False, feature_layers=feature_layers)
  last = (input_lengths - 1).astype(jnp.int32)
  first = jnp.take_along_axis(input_ids, last[:, None], axis=1)[:, 0].astype(jnp.int32)
  return cache.replace(lengths=last, offsets=last), first, features


def forward(params: dict, cfg: DecoderOnlyConfig, input_ids: jax.Array) -> jax.Array:
  """Logits [B, S, V] of a full causal pass over input_ids [B, S] (right padding never affects real positions)."""
  cache = init_cache(cfg, input_ids.shape[0], input_ids.shape[1], params["embedding"].dtype)
  logits, _ = decode(params, cfg, cache, input_ids)
  return logits


@dataclasses.dataclass(frozen=True)
class CausalDecoder:
  """`jaxspec.models.contract.Decoder` for decoder-only models, bound to a config (hashable: a static argument).

  `prefill` writes the prompts in one call; the loop's first token is each prompt's last token, at position
  len - 1, so the first logits the loop sees predict the first new token. `step` feeds [B, T] tokens (or tree
  nodes) at the per-row positions `cache.lengths`.
  """

  config: DecoderOnlyConfig

  def prefill(self, params: dict, input_ids: jax.Array, input_lengths: jax.Array, cache_len: int, *,
              layers: tuple[int, ...] = (), encoder: bool = False) -> Prefilled:
    """`contract.Decoder.prefill`: the prompts written in one call; with `layers`, the prompt's features
    [B, S, len(layers) * D] too: feature s is that of prompt position s, for every s < input_lengths (the last
    real position included: the pass runs over all S tokens even though the cache keeps len - 1 positions);
    positions past a row's length hold the padding's features. Layer i's feature is the residual stream before
    layer i's norm (index num_layers: the final pre-norm output; transformers' hidden_states[i] for i < L)."""
    if encoder:
      raise ValueError("a decoder-only model has no encoder output (prefill(..., encoder=True) is for "
                       "encoder-decoder targets).")
    layers = check_feature_layers(layers, self.config.num_layers) if layers else ()
    cache, first, features = _prefill(params, self.config, input_ids, input_lengths, cache_len, layers)
    return Prefilled(cache=cache, first=first, features=features)

  def step(self, params: dict, cache: DecoderOnlyCache, tokens: jax.Array, *, tree: TreeNodes | None = None,
           layers: tuple[int, ...] = ()) -> StepResult:
    """`contract.Decoder.step`: tokens [B, T] at the per-row positions cache.lengths (see `decode`), or T nodes
    of a token tree (`tree`: node n at position lengths - P + depths[:, P + n], RoPE and sliding window by that
    position, written at slot lengths + n; `contract.tree_attention`), with the features entering `layers`."""
    layers = check_feature_layers(layers, self.config.num_layers) if layers else ()
    nodes = None if tree is None else (tree.depths.astype(jnp.int32), tree.ancestors.astype(bool))
    logits, features, cache = _run(params, self.config, cache, tokens, cache.max_length, with_logits=True,
                                   feature_layers=layers, tree=nodes)
    return StepResult(logits=logits, features=features, cache=cache)

  @property
  def num_feature_layers(self) -> int:
    """The largest feature index: num_layers (the final pre-norm output)."""
    return self.config.num_layers

  @property
  def feature_size(self) -> int:
    """D: the width of one layer's feature."""
    return self.config.hidden_size

  def cache_axes(self) -> DecoderOnlyCache:
    """Logical axis names of the cache's arrays (`cache_axes`)."""
    return cache_axes(self.config)
