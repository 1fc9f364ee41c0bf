"""A functional T5: parameters are a plain pytree, caches are explicit pytrees passed in and returned.

    params = init_params(config, key)
    cache = init_cache(params, config, input_ids, max_decode_len)  # runs the encoder once
    logits, cache = decode(params, config, cache, tokens)          # tokens [B, T] at per-row offsets

`decode` writes the T new positions of every row at that row's `cache.lengths` and advances it by T. Masks
derive from the lengths (a query at position t sees keys at positions <= t), so setting `lengths` back is a
complete rollback: stale keys beyond it are never attended to and are overwritten later.

Shape letters: B batch, S encoder positions, T new decoder positions, C cache positions, L layers, N heads,
H head width (d_kv), D d_model, F d_ff, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.models.t5 import layers
from jaxspec.models.t5.config import T5Config


@struct.dataclass
class T5Cache:
  """Decoder state for one batch of encoder inputs."""

  # Decoder self-attention keys and values: one [B, C, N, H] array per layer, written in place at per-row
  # offsets. Separate arrays (not one stacked [L, ...] array) let XLA update each without copying the others.
  self_k: tuple[jax.Array, ...]
  self_v: tuple[jax.Array, ...]
  cross_k: jax.Array  # [L, B, S, N, H] cross-attention keys: computed once from the encoder, never rolled back.
  cross_v: jax.Array  # [L, B, S, N, H]
  encoder_mask: jax.Array  # [B, S] bool, True at real (non-pad) encoder tokens.
  lengths: jax.Array  # [B] int32, decoder positions already written per row.

  @property
  def max_length(self) -> int:
    return self.self_k[0].shape[1]


def cache_axes(cfg: T5Config) -> T5Cache:
  """Logical axis names of every cache array: a T5Cache of name tuples matching `init_cache`'s output.

  Leaves are tuples of strings; with jax.tree functions use
  `is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(a, str) for a in x)`.
  """
  per_layer = tuple(("batch", "cache_seq", "heads", "kv") for _ in range(cfg.num_decoder_layers))
  return T5Cache(self_k=per_layer, self_v=per_layer,
                 cross_k=("layers", "batch", "encoder_seq", "heads", "kv"),
                 cross_v=("layers", "batch", "encoder_seq", "heads", "kv"),
                 encoder_mask=("batch", "encoder_seq"), lengths=("batch",))


def _mlp_axes(cfg: T5Config) -> dict:
  wi = {"wi_0": ("embed", "mlp"), "wi_1": ("embed", "mlp")} if cfg.gated else {"wi": ("embed", "mlp")}
  return {**wi, "wo": ("mlp", "embed")}


_ATTENTION_AXES = {"q": ("embed", "heads", "kv"), "k": ("embed", "heads", "kv"),
                   "v": ("embed", "heads", "kv"), "o": ("heads", "kv", "embed")}


def param_axes(cfg: T5Config) -> dict:
  """Logical axis names of every parameter: a pytree with the structure of `init_params(cfg, ...)`."""
  enc_layer = {"attention": dict(_ATTENTION_AXES), "attention_norm": ("embed",),
               "mlp": _mlp_axes(cfg), "mlp_norm": ("embed",)}
  dec_layer = {"self_attention": dict(_ATTENTION_AXES), "self_attention_norm": ("embed",),
               "cross_attention": dict(_ATTENTION_AXES), "cross_attention_norm": ("embed",),
               "mlp": _mlp_axes(cfg), "mlp_norm": ("embed",)}
  axes = {
      "shared": {"embedding": ("vocab", "embed")},
      "encoder": {"relpos_bias": ("relpos_buckets", "heads"), "final_norm": ("embed",),
                  "layers": [enc_layer for _ in range(cfg.num_layers)]},
      "decoder": {"relpos_bias": ("relpos_buckets", "heads"), "final_norm": ("embed",),
                  "layers": [dec_layer for _ in range(cfg.num_decoder_layers)]},
  }
  if not cfg.tie_word_embeddings:
    axes["lm_head"] = ("embed", "vocab")
  return axes


def param_shapes(cfg: T5Config) -> dict:
  """The shape of every parameter, as a pytree of tuples matching `param_axes(cfg)`."""
  size = {"vocab": cfg.vocab_size, "embed": cfg.d_model, "heads": cfg.num_heads, "kv": cfg.d_kv,
          "mlp": cfg.d_ff, "relpos_buckets": cfg.relative_attention_num_buckets}
  return jax.tree.map(lambda axes: tuple(size[a] for a in axes), param_axes(cfg),
                      is_leaf=lambda x: isinstance(x, tuple))


def _init_std(path: tuple, cfg: T5Config) -> float:
  """T5's initialisation scales (Mesh TensorFlow / transformers `_init_weights`), keyed by parameter name."""
  name = path[-1]
  if name in ("embedding", "lm_head"):
    return 1.0
  if name == "q":
    return (cfg.d_model * cfg.d_kv) ** -0.5
  if name in ("k", "v", "wi", "wi_0", "wi_1", "relpos_bias"):
    return cfg.d_model ** -0.5
  if name == "o":
    return (cfg.num_heads * cfg.d_kv) ** -0.5
  if name == "wo":
    return cfg.d_ff ** -0.5
  raise KeyError(name)


def init_params(cfg: T5Config, key: jax.Array, dtype=jnp.float32) -> dict:
  """Random parameters with T5's initialisation (norm scales are ones)."""
  shapes = param_shapes(cfg)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
  keys = jax.random.split(key, len(leaves))
  out = []
  for k, (path, shape) in zip(keys, leaves):
    names = tuple(getattr(p, "key", getattr(p, "idx", None)) for p in path)
    if names[-1] in ("attention_norm", "mlp_norm", "final_norm", "self_attention_norm", "cross_attention_norm"):
      out.append(jnp.ones(shape, dtype))
    else:
      out.append((jax.random.normal(k, shape, jnp.float32) * _init_std(names, cfg)).astype(dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def _embed(params: dict, ids: jax.Array) -> jax.Array:
  return jnp.take(params["shared"]["embedding"], ids, axis=0)


def encode(params: dict, cfg: T5Config, input_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Runs the encoder. input_ids: [B, S] int, padded with pad_token_id.

  Returns:
    hidden [B, S, D] and mask [B, S] (True at real tokens).
  """
  enc = params["encoder"]
  mask = input_ids != cfg.pad_token_id
  pos = jnp.arange(input_ids.shape[1])
  rel = jnp.broadcast_to(pos[None, None, :] - pos[None, :, None], (1,) + (input_ids.shape[1],) * 2)
  bias = layers.relative_position_bias(enc["relpos_bias"], rel, bidirectional=True,
                                       max_distance=cfg.relative_attention_max_distance)  # [1, N, S, S]
  allowed = mask[:, None, None, :]  # [B, 1, 1, S]
  x = _embed(params, input_ids)
  for lp in enc["layers"]:
    h = layers.rms_norm(x, lp["attention_norm"], cfg.layer_norm_epsilon)
    a = lp["attention"]
    q, k, v = (layers.project_heads(h, a[n]) for n in "qkv")
    x = x + layers.attend(q, k, v, bias, allowed, a["o"])
    h = layers.rms_norm(x, lp["mlp_norm"], cfg.layer_norm_epsilon)
    x = x + layers.feed_forward(lp["mlp"], h, cfg.activation, cfg.gated)
  return layers.rms_norm(x, enc["final_norm"], cfg.layer_norm_epsilon), mask


def init_cache(params: dict, cfg: T5Config, input_ids: jax.Array, max_decode_len: int) -> T5Cache:
  """Encodes input_ids [B, S] once and preallocates a decoder cache of max_decode_len positions per row."""
  hidden, mask = encode(params, cfg, input_ids)
  dec_layers = params["decoder"]["layers"]
  cross_k = jnp.stack([layers.project_heads(hidden, lp["cross_attention"]["k"]) for lp in dec_layers])
  cross_v = jnp.stack([layers.project_heads(hidden, lp["cross_attention"]["v"]) for lp in dec_layers])
  batch = input_ids.shape[0]
  shape = (batch, max_decode_len, cfg.num_heads, cfg.d_kv)
  dtype = params["shared"]["embedding"].dtype
  def empty():  # Distinct arrays for K and V: a donated cache must not hold one buffer twice.
    return tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_decoder_layers))
  return T5Cache(self_k=empty(), self_v=empty(), cross_k=cross_k, cross_v=cross_v, encoder_mask=mask,
                 lengths=jnp.zeros((batch,), jnp.int32))


def _write_rows(buffer: jax.Array, block: jax.Array, offsets: jax.Array) -> jax.Array:
  """Writes block [B, T, N, H] into buffer [B, C, N, H] at per-row positions offsets [B]."""
  return jax.vmap(lambda buf, blk, off: jax.lax.dynamic_update_slice_in_dim(buf, blk, off, axis=0))(
      buffer, block, offsets)


def decode(params: dict, cfg: T5Config, cache: T5Cache, tokens: jax.Array) -> tuple[jax.Array, T5Cache]:
  """Feeds T new decoder tokens per row at that row's offset `cache.lengths`.

  The caller must leave room: lengths + T <= cache.max_length (dynamic_update_slice would silently shift a
  write that runs past the end).

  Args:
    tokens: [B, T] int decoder input ids.
  Returns:
    logits [B, T, V] float32 (position t predicts the token after tokens[:, t]) and the cache with the new keys
    and values written and lengths advanced by T.
  """
  dec = params["decoder"]
  offsets = cache.lengths
  query_pos = offsets[:, None] + jnp.arange(tokens.shape[1])  # [B, T]
  key_pos = jnp.arange(cache.max_length)  # [C]
  bias = layers.relative_position_bias(dec["relpos_bias"], key_pos[None, None, :] - query_pos[:, :, None],
                                       bidirectional=False,
                                       max_distance=cfg.relative_attention_max_distance)  # [B, N, T, C]
  causal = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]  # [B, 1, T, C]
  cross_allowed = cache.encoder_mask[:, None, None, :]  # [B, 1, 1, S]
  x = _embed(params, tokens)
  self_k, self_v = list(cache.self_k), list(cache.self_v)
  for i, lp in enumerate(dec["layers"]):
    h = layers.rms_norm(x, lp["self_attention_norm"], cfg.layer_norm_epsilon)
    a = lp["self_attention"]
    q, k, v = (layers.project_heads(h, a[n]) for n in "qkv")
    self_k[i] = _write_rows(self_k[i], k, offsets)
    self_v[i] = _write_rows(self_v[i], v, offsets)
    x = x + layers.attend(q, self_k[i], self_v[i], bias, causal, a["o"])
    h = layers.rms_norm(x, lp["cross_attention_norm"], cfg.layer_norm_epsilon)
    q = layers.project_heads(h, lp["cross_attention"]["q"])
    x = x + layers.attend(q, cache.cross_k[i], cache.cross_v[i], None, cross_allowed, lp["cross_attention"]["o"])
    h = layers.rms_norm(x, lp["mlp_norm"], cfg.layer_norm_epsilon)
    x = x + layers.feed_forward(lp["mlp"], h, cfg.activation, cfg.gated)
  x = layers.rms_norm(x, dec["final_norm"], cfg.layer_norm_epsilon)
  if cfg.scale_decoder_outputs:
    x = x * (cfg.d_model ** -0.5)
  if cfg.tie_word_embeddings:
    logits = jnp.einsum("btd,vd->btv", x, params["shared"]["embedding"])
  else:
    logits = jnp.einsum("btd,dv->btv", x, params["lm_head"])
  new_cache = cache.replace(self_k=tuple(self_k), self_v=tuple(self_v), lengths=offsets + tokens.shape[1])
  return logits.astype(jnp.float32), new_cache


def forward(params: dict, cfg: T5Config, input_ids: jax.Array, decoder_input_ids: jax.Array) -> jax.Array:
  """Teacher-forced logits [B, T, V] for encoder ids [B, S] and decoder ids [B, T] (start token first)."""
  cache = init_cache(params, cfg, input_ids, decoder_input_ids.shape[1])
  logits, _ = decode(params, cfg, cache, decoder_input_ids)
  return logits


@dataclasses.dataclass(frozen=True)
class T5Decoder:
  """The two calls a decoding loop needs, bound to a config (hashable, so usable as a static jit argument).

  `init(params, input_ids, cache_len) -> cache` runs the encoder; `step(params, cache, tokens) -> (logits,
  cache)` feeds [B, T] tokens at the per-row offsets `cache.lengths`. Decoding loops see only these two, so
  other architectures can plug in behind the same interface.
  """

  config: T5Config

  def init(self, params: dict, input_ids: jax.Array, cache_len: int) -> T5Cache:
    return init_cache(params, self.config, input_ids, cache_len)

  def step(self, params: dict, cache: T5Cache, tokens: jax.Array) -> tuple[jax.Array, T5Cache]:
    return decode(params, self.config, cache, tokens)
