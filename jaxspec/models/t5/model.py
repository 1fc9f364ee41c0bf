"""A functional T5: parameters are a plain pytree, caches are explicit pytrees passed in and returned.

    params = init_params(config, key)
    cache = init_cache(params, config, input_ids, max_decode_len)  # runs the encoder once
    logits, cache = decode(params, config, cache, tokens)          # tokens [B, T] at per-row offsets

    logits = forward(params, config, input_ids, decoder_input_ids, dropout_rate=0.1, dropout_rng=key)  # training

`decode` writes the T new positions of every row at that row's `cache.lengths` and advances it by T. Masks
derive from the lengths (a query at position t sees keys at positions <= t), so setting `lengths` back is a
complete rollback: stale keys beyond it are never attended to and are overwritten later.

Keys and values are stored head-major, [B, N, C, H]: the attention dots' batch dimensions (b, n) lead, so XLA
reads the caches as they are. Position-major caches ([B, C, N, H]) made XLA transpose them in every decoder
step, a third more kernels in a small draft's step on a GPU (docs/bench/h100/gpu_profile.md).

Dropout exists for training only: `forward` with a dropout rng, or `encode` / `init_cache` / `decode` with a
`Dropout`; without one (the decoding paths) the computation is exactly the one without dropout.

Shape letters: B batch, S encoder positions, T new decoder positions, C cache positions, L layers, N heads,
H head width (d_kv), D d_model, F d_ff, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.models.contract import (CachePositions, Prefilled, StepResult, TreeNodes, check_feature_layers,
                                     shapes_from_axes, tree_attention, write_rows)
from jaxspec.models.t5 import layers
from jaxspec.models.t5.config import T5Config


@struct.dataclass
class T5Cache(CachePositions):
  """Decoder state for one batch of encoder inputs (`jaxspec.models.contract.DecoderCache`)."""

  # For `compact`: positions are axis 2 of every head-major [B, N, C, H] self-attention array (cross-attention
  # keys and values are per encoder position: never moved).
  position_fields = {"self_k": 2, "self_v": 2}

  # Decoder self-attention keys and values: one [B, N, C, H] array per layer, written in place at per-row
  # offsets. Separate arrays (not one stacked [L, ...] array) let XLA update each without copying the others.
  self_k: tuple[jax.Array, ...]
  self_v: tuple[jax.Array, ...]
  cross_k: jax.Array  # [L, B, N, S, H] cross-attention keys: computed once from the encoder, never rolled back.
  cross_v: jax.Array  # [L, B, N, S, H]
  encoder_mask: jax.Array  # [B, S] bool, True at real (non-pad) encoder tokens.
  lengths: jax.Array  # [B] int32, decoder positions already written per row.
  offsets: jax.Array  # [B] int32 zeros: the decoder starts empty (its start token is the loop's first token).

  @property
  def max_length(self) -> int:
    return self.self_k[0].shape[2]


def cache_axes(cfg: T5Config) -> T5Cache:
  """Logical axis names of every cache array: a T5Cache of name tuples matching `init_cache`'s output.

  Leaves are tuples of strings; with jax.tree functions use
  `is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(a, str) for a in x)`.
  """
  per_layer = tuple(("batch", "heads", "cache_seq", "kv") for _ in range(cfg.num_decoder_layers))
  return T5Cache(self_k=per_layer, self_v=per_layer,
                 cross_k=("layers", "batch", "heads", "encoder_seq", "kv"),
                 cross_v=("layers", "batch", "heads", "encoder_seq", "kv"),
                 encoder_mask=("batch", "encoder_seq"), lengths=("batch",), offsets=("batch",))


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
  return shapes_from_axes(param_axes(cfg), size)


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


class Dropout:
  """Training-time dropout: zeroes `rate` of the activations at each call site and scales the rest by
  1 / (1 - rate); every call draws its mask from `rng` folded with a call counter, so sites never share a mask."""

  def __init__(self, rate: float, rng: jax.Array):
    if not 0.0 < rate < 1.0:
      raise ValueError(f"dropout rate must be in (0, 1), got {rate}.")
    self.rate, self.rng, self.calls = rate, rng, 0

  def __call__(self, x: jax.Array) -> jax.Array:
    self.calls += 1
    keep = jax.random.bernoulli(jax.random.fold_in(self.rng, self.calls), 1.0 - self.rate, x.shape)
    return jnp.where(keep, x / (1.0 - self.rate), 0.0).astype(x.dtype)


def _drop(dropout: Dropout | None, x: jax.Array) -> jax.Array:
  return x if dropout is None else dropout(x)


def _embed(params: dict, ids: jax.Array) -> jax.Array:
  return jnp.take(params["shared"]["embedding"], ids, axis=0)


def encode(params: dict, cfg: T5Config, input_ids: jax.Array, *,
           dropout: Dropout | None = None) -> tuple[jax.Array, jax.Array]:
  """Runs the encoder. input_ids: [B, S] int, padded with pad_token_id.

  dropout (training only): applied to the embeddings, every sublayer's output and the final hidden states.
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
  x = _drop(dropout, _embed(params, input_ids))
  for lp in enc["layers"]:
    h = layers.rms_norm(x, lp["attention_norm"], cfg.layer_norm_epsilon)
    a = lp["attention"]
    q, k, v = layers.project_heads(h, a["q"]), layers.project_kv(h, a["k"]), layers.project_kv(h, a["v"])
    x = x + _drop(dropout, layers.attend(q, k, v, bias, allowed, a["o"]))
    h = layers.rms_norm(x, lp["mlp_norm"], cfg.layer_norm_epsilon)
    x = x + _drop(dropout, layers.feed_forward(lp["mlp"], h, cfg.activation, cfg.gated))
  return _drop(dropout, layers.rms_norm(x, enc["final_norm"], cfg.layer_norm_epsilon)), mask


def init_cache(params: dict, cfg: T5Config, input_ids: jax.Array, max_decode_len: int, *,
               dropout: Dropout | None = None) -> T5Cache:
  """Encodes input_ids [B, S] once and preallocates a decoder cache of max_decode_len positions per row.

  dropout: the encoder's (training only; see `encode`)."""
  hidden, mask = encode(params, cfg, input_ids, dropout=dropout)
  return cache_from_encoded(params, cfg, hidden, mask, max_decode_len)


def cache_from_encoded(params: dict, cfg: T5Config, hidden: jax.Array, mask: jax.Array,
                       max_decode_len: int) -> T5Cache:
  """`init_cache` from the encoder's output (hidden [B, S, D], mask [B, S] from `encode`), already computed."""
  dec_layers = params["decoder"]["layers"]
  cross_k = jnp.stack([layers.project_kv(hidden, lp["cross_attention"]["k"]) for lp in dec_layers])
  cross_v = jnp.stack([layers.project_kv(hidden, lp["cross_attention"]["v"]) for lp in dec_layers])
  batch = hidden.shape[0]
  shape = (batch, cfg.num_heads, max_decode_len, cfg.d_kv)
  dtype = params["shared"]["embedding"].dtype
  def empty():  # Distinct arrays for K and V: a donated cache must not hold one buffer twice.
    return tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_decoder_layers))
  zeros = jnp.zeros((batch,), jnp.int32)
  return T5Cache(self_k=empty(), self_v=empty(), cross_k=cross_k, cross_v=cross_v, encoder_mask=mask,
                 lengths=zeros, offsets=zeros)


def decode(params: dict, cfg: T5Config, cache: T5Cache, tokens: jax.Array, *,
           dropout: Dropout | None = None) -> tuple[jax.Array, T5Cache]:
  """Feeds T new decoder tokens per row at that row's offset `cache.lengths`.

  The caller must leave room: lengths + T <= cache.max_length (dynamic_update_slice would silently shift a
  write that runs past the end).

  Args:
    tokens: [B, T] int decoder input ids.
    dropout: training only (teacher forcing through `forward`): applied to the embeddings, every sublayer's
      output and the final hidden states. None (decoding) adds nothing to the computation.
  Returns:
    logits [B, T, V] float32 (position t predicts the token after tokens[:, t]) and the cache with the new keys
    and values written and lengths advanced by T.
  """
  logits, _, cache = _decode(params, cfg, cache, tokens, dropout, ())
  return logits, cache


def _decode(params: dict, cfg: T5Config, cache: T5Cache, tokens: jax.Array, dropout: Dropout | None,
            feature_layers: tuple[int, ...], tree: tuple[jax.Array, jax.Array] | None = None
            ) -> tuple[jax.Array, jax.Array | None, T5Cache]:
  """`decode`, collecting the hidden states entering `feature_layers` (static; () collects nothing). `tree`
  (depths [B, T], ancestors [B, T, T]) feeds the tokens as tree nodes (`T5Decoder.step`'s `tree`); None is the plain causal
  step, whose computation it leaves untouched."""
  dec = params["decoder"]
  starts = cache.lengths  # [B] where this call writes
  if tree is None:
    query_pos = starts[:, None] + jnp.arange(tokens.shape[1])  # [B, T]
    key_pos = jnp.arange(cache.max_length)  # [C]
    bias = layers.relative_position_bias(dec["relpos_bias"], key_pos[None, None, :] - query_pos[:, :, None],
                                         bidirectional=False,
                                         max_distance=cfg.relative_attention_max_distance)  # [B, N, T, C]
    causal = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]  # [B, 1, T, C]
  else:
    query_pos, key_pos, allowed = tree_attention(starts, *tree, cache.max_length)  # [B, T], [B, C], [B, T, C]
    bias = layers.relative_position_bias(dec["relpos_bias"], key_pos[:, None, :] - query_pos[:, :, None],
                                         bidirectional=False,
                                         max_distance=cfg.relative_attention_max_distance)  # [B, N, T, C]
    causal = allowed[:, None]  # [B, 1, T, C]
  cross_allowed = cache.encoder_mask[:, None, None, :]  # [B, 1, 1, S]
  x = _drop(dropout, _embed(params, tokens))
  self_k, self_v = list(cache.self_k), list(cache.self_v)
  entering = {}  # Layer index -> hidden state [B, T, D] entering it (only the layers asked for).
  for i, lp in enumerate(dec["layers"]):
    if i in feature_layers:
      entering[i] = x
    h = layers.rms_norm(x, lp["self_attention_norm"], cfg.layer_norm_epsilon)
    a = lp["self_attention"]
    q, k, v = layers.project_heads(h, a["q"]), layers.project_kv(h, a["k"]), layers.project_kv(h, a["v"])
    self_k[i] = write_rows(self_k[i], k, starts, axis=1)
    self_v[i] = write_rows(self_v[i], v, starts, axis=1)
    x = x + _drop(dropout, layers.attend(q, self_k[i], self_v[i], bias, causal, a["o"]))
    h = layers.rms_norm(x, lp["cross_attention_norm"], cfg.layer_norm_epsilon)
    q = layers.project_heads(h, lp["cross_attention"]["q"])
    x = x + _drop(dropout, layers.attend(q, cache.cross_k[i], cache.cross_v[i], None, cross_allowed,
                                         lp["cross_attention"]["o"]))
    h = layers.rms_norm(x, lp["mlp_norm"], cfg.layer_norm_epsilon)
    x = x + _drop(dropout, layers.feed_forward(lp["mlp"], h, cfg.activation, cfg.gated))
  features = None
  if feature_layers:
    entering[cfg.num_decoder_layers] = x
    features = jnp.concatenate([entering[i] for i in feature_layers], axis=-1)
  x = _drop(dropout, layers.rms_norm(x, dec["final_norm"], cfg.layer_norm_epsilon))
  if cfg.scale_decoder_outputs:
    x = x * (cfg.d_model ** -0.5)
  if cfg.tie_word_embeddings:
    logits = jnp.einsum("btd,vd->btv", x, params["shared"]["embedding"])
  else:
    logits = jnp.einsum("btd,dv->btv", x, params["lm_head"])
  new_cache = cache.replace(self_k=tuple(self_k), self_v=tuple(self_v), lengths=starts + tokens.shape[1])
  return logits.astype(jnp.float32), features, new_cache


def forward(params: dict, cfg: T5Config, input_ids: jax.Array, decoder_input_ids: jax.Array, *,
            dropout_rate: float = 0.0, dropout_rng: jax.Array | None = None) -> jax.Array:
  """Teacher-forced logits [B, T, V] for encoder ids [B, S] and decoder ids [B, T] (start token first).

  Training: with dropout_rate > 0 and a dropout_rng (a jax.random key), dropout as in `encode` and `decode`; the
  encoder and decoder draw from keys folded from dropout_rng. Rate 0 or no rng: no dropout.
  """
  enc_drop = dec_drop = None
  if dropout_rate > 0 and dropout_rng is not None:
    enc_drop = Dropout(dropout_rate, jax.random.fold_in(dropout_rng, 0))
    dec_drop = Dropout(dropout_rate, jax.random.fold_in(dropout_rng, 1))
  cache = init_cache(params, cfg, input_ids, decoder_input_ids.shape[1], dropout=enc_drop)
  logits, _ = decode(params, cfg, cache, decoder_input_ids, dropout=dec_drop)
  return logits


@dataclasses.dataclass(frozen=True)
class T5Decoder:
  """`jaxspec.models.contract.Decoder` for T5, bound to a config (hashable: a static jit argument).

  `prefill` runs the encoder once (its padding is masked by pad id) and preallocates the decoder cache; the loop's
  first token is the decoder start token. `step` feeds [B, T] tokens at the per-row offsets `cache.lengths`.
  """

  config: T5Config

  def prefill(self, params: dict, input_ids: jax.Array, input_lengths: jax.Array, cache_len: int, *,
              layers: tuple[int, ...] = (), encoder: bool = False) -> Prefilled:
    """`contract.Decoder.prefill`: the encoder once, the cross-attention keys and values from its output, an
    empty decoder cache. With `layers`, the decoder features of the positions it processed: none, [B, 0,
    len(layers) * D] (the decoder starts empty; its first features come from the loop's first step); with
    `encoder`, the encoder's output (encoded [B, S, D], mask [B, S] bool) for a drafter that reads it (a T5
    target's feature head)."""
    del input_lengths  # The encoder masks pad ids, as transformers' attention mask from padded inputs does.
    layers = check_feature_layers(layers, self.config.num_decoder_layers) if layers else ()
    encoded, mask = encode(params, self.config, input_ids)
    cache = cache_from_encoded(params, self.config, encoded, mask, cache_len)
    batch = input_ids.shape[0]
    first = jnp.full((batch,), self.config.decoder_start_token_id, jnp.int32)
    features = jnp.zeros((batch, 0, len(layers) * self.config.d_model), encoded.dtype) if layers else None
    return Prefilled(cache=cache, first=first, features=features, encoder=(encoded, mask) if encoder else None)

  def step(self, params: dict, cache: T5Cache, tokens: jax.Array, *, tree: TreeNodes | None = None,
           layers: tuple[int, ...] = ()) -> StepResult:
    """`contract.Decoder.step`: tokens [B, T] at the per-row offsets cache.lengths (see `decode`), or T nodes of
    a token tree (`tree`: node n at decoder position lengths - P + depths[:, P + n], its relative position bias
    computed from that position and each key's, written at slot lengths + n; `contract.tree_attention`), with
    the decoder features entering `layers` (index i: the residual stream before decoder layer i's first norm;
    num_decoder_layers the final pre-norm output; transformers' decoder_hidden_states[i] for i < L)."""
    layers = check_feature_layers(layers, self.config.num_decoder_layers) if layers else ()
    nodes = None if tree is None else (tree.depths.astype(jnp.int32), tree.ancestors.astype(bool))
    logits, features, cache = _decode(params, self.config, cache, tokens, None, layers, tree=nodes)
    return StepResult(logits=logits, features=features, cache=cache)

  @property
  def num_feature_layers(self) -> int:
    """The largest feature index: num_decoder_layers (the decoder's final pre-norm output)."""
    return self.config.num_decoder_layers

  @property
  def feature_size(self) -> int:
    """D: the width of one layer's feature."""
    return self.config.d_model

  def cache_axes(self) -> T5Cache:
    """Logical axis names of the cache's arrays (`cache_axes`)."""
    return cache_axes(self.config)
