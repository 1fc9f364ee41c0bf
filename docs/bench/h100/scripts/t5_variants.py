"""Variants of T5's decoder step, for timing on the GPU (exploration; not library code).

Opts() is the position-major step of commit e000a82; Opts(layout="bnch") is the head-major step that
jaxspec/models/t5/model.py now has. `barrier` was added after the GPU run and never measured there.

Options:
  layout: "bcnh" (the library's caches [B, C, N, H]) or "bnch" (head-major [B, N, C, H]: the attention dots'
    batch dims lead, no transposes).
  qkv: "dot" (three einsums), "reduce" (three multiply-sum reductions sharing h: one multi-output fusion?),
    "concat" (weights concatenated in the step: one dot).
  fold: cross-attention folded per input at prefill: scores = h . (W_q K^T), out = w . (V W_o).
  attn: "dot" or "reduce" (scores and weighted sums as multiply-sum reductions).
  mlp: "dot" or "reduce"; out: the attention output projections, "dot" or "reduce".
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.models.contract import CachePositions
from jaxspec.models.t5 import layers
from jaxspec.models.t5 import model as t5model

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Opts:
  layout: str = "bcnh"
  qkv: str = "dot"
  fold: bool = False
  attn: str = "dot"
  mlp: str = "dot"
  out: str = "dot"
  barrier: bool = False  # optimization_barrier on each matmul's activation operand (materialise it first).


@struct.dataclass
class VCache(CachePositions):
  self_k: tuple
  self_v: tuple
  cross_a: jax.Array  # [L, B, S, N, H] / [L, B, N, S, H] keys, or [L, B, D, N, S] W_q K^T when folded
  cross_b: jax.Array  # values, or [L, B, N, S, D] V W_o when folded
  encoder_mask: jax.Array
  lengths: jax.Array
  offsets: jax.Array


def _mm(x, w, how, barrier=False):
  """x [..., K] contracted with w [K, ...rest] -> [..., rest] in x's dtype (f32 accumulation)."""
  if barrier:
    x = jax.lax.optimization_barrier(x)
  if how == "dot":
    return jnp.tensordot(x, w, axes=1)
  rest = w.shape[1:]
  xe = x.reshape(x.shape + (1,) * len(rest)).astype(F32)
  return jnp.sum(xe * w.astype(F32), axis=x.ndim - 1).astype(x.dtype)


def init_cache(params, cfg, input_ids, max_len, o: Opts) -> VCache:
  hidden, mask = t5model.encode(params, cfg, input_ids)
  dec_layers = params["decoder"]["layers"]
  ks = [layers.project_heads(hidden, lp["cross_attention"]["k"]) for lp in dec_layers]  # [B, S, N, H]
  vs = [layers.project_heads(hidden, lp["cross_attention"]["v"]) for lp in dec_layers]
  if o.fold:
    a = jnp.stack([jnp.einsum("dnh,bsnh->bdns", lp["cross_attention"]["q"], k) for lp, k in zip(dec_layers, ks)])
    b = jnp.stack([jnp.einsum("bsnh,nhe->bnse", v, lp["cross_attention"]["o"]) for lp, v in zip(dec_layers, vs)])
  elif o.layout == "bnch":
    a = jnp.stack([k.transpose(0, 2, 1, 3) for k in ks])
    b = jnp.stack([v.transpose(0, 2, 1, 3) for v in vs])
  else:
    a, b = jnp.stack(ks), jnp.stack(vs)
  batch = input_ids.shape[0]
  shape = ((batch, cfg.num_heads, max_len, cfg.d_kv) if o.layout == "bnch" else
           (batch, max_len, cfg.num_heads, cfg.d_kv))
  dtype = params["shared"]["embedding"].dtype
  empty = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_decoder_layers))
  zeros = jnp.zeros((batch,), jnp.int32)
  return VCache(self_k=empty(), self_v=empty(), cross_a=a, cross_b=b, encoder_mask=mask, lengths=zeros,
                offsets=zeros)


def _write(buf, blk, starts, axis):
  return jax.vmap(lambda b, k, s: jax.lax.dynamic_update_slice_in_dim(b, k, s, axis=axis - 1))(buf, blk, starts)


def _attend(q, k, v, bias, allowed, w_o, o: Opts, layout: str):
  """q [B, T, N, H]; k, v [B, S, N, H] (bcnh) or [B, N, S, H] (bnch); bias [B, N, T, S] or None."""
  kk = "bsnh" if layout == "bcnh" else "bnsh"
  if o.attn == "dot":
    scores = jnp.einsum(f"btnh,{kk}->bnts", q, k).astype(F32)
  else:
    kn = k if layout == "bnch" else k.transpose(0, 2, 1, 3)  # [B, N, S, H]
    qn = q.transpose(0, 2, 1, 3)  # [B, N, T, H]
    scores = jnp.sum(qn[:, :, :, None, :].astype(F32) * kn[:, :, None, :, :].astype(F32), axis=-1)
  if bias is not None:
    scores = scores + bias
  scores = jnp.where(allowed, scores, jnp.finfo(F32).min)
  w = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  if o.barrier:
    w = jax.lax.optimization_barrier(w)
  if o.attn == "dot":
    out = jnp.einsum(f"bnts,{kk}->btnh", w, v)
  else:
    vn = v if layout == "bnch" else v.transpose(0, 2, 1, 3)
    out = jnp.sum(w[..., None].astype(F32) * vn[:, :, None, :, :].astype(F32), axis=3)  # [B, N, T, H]
    out = out.transpose(0, 2, 1, 3).astype(v.dtype)
  n, h, d = w_o.shape
  return _mm(out.reshape(out.shape[:2] + (n * h,)), w_o.reshape(n * h, d), o.out, o.barrier)


def _ff(p, x, cfg, how, barrier=False):
  act = layers._ACT[cfg.activation]
  if cfg.gated:
    h = act(_mm(x, p["wi_0"], how, barrier)) * _mm(x, p["wi_1"], how, barrier)
  else:
    h = act(_mm(x, p["wi"], how, barrier))
  return _mm(h, p["wo"], how, barrier)


def decode(params, cfg, cache: VCache, tokens, o: Opts):
  dec = params["decoder"]
  bnch = o.layout == "bnch"
  cache_len = cache.self_k[0].shape[2 if bnch else 1]
  starts = cache.lengths
  t = tokens.shape[1]
  query_pos = starts[:, None] + jnp.arange(t)
  key_pos = jnp.arange(cache_len)
  bias = layers.relative_position_bias(dec["relpos_bias"], key_pos[None, None, :] - query_pos[:, :, None],
                                       bidirectional=False, max_distance=cfg.relative_attention_max_distance)
  causal = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]
  cross_allowed = cache.encoder_mask[:, None, None, :]
  x = jnp.take(params["shared"]["embedding"], tokens, axis=0)
  self_k, self_v = list(cache.self_k), list(cache.self_v)
  eps = cfg.layer_norm_epsilon
  for i, lp in enumerate(dec["layers"]):
    h = layers.rms_norm(x, lp["self_attention_norm"], eps)
    a = lp["self_attention"]
    if o.qkv == "concat":
      w = jnp.concatenate([a["q"], a["k"], a["v"]], axis=1)  # [D, 3N, H]
      q, k, v = jnp.split(jnp.einsum("btd,dnh->btnh", h, w), 3, axis=2)
    else:
      q, k, v = (_mm(h, a[n], o.qkv, o.barrier) for n in "qkv")
    if bnch:
      k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    self_k[i] = _write(self_k[i], k, starts, 2 if bnch else 1)
    self_v[i] = _write(self_v[i], v, starts, 2 if bnch else 1)
    x = x + _attend(q, self_k[i], self_v[i], bias, causal, a["o"], o, o.layout)
    h = layers.rms_norm(x, lp["cross_attention_norm"], eps)
    ca = lp["cross_attention"]
    if o.fold:
      scores = jnp.einsum("btd,bdns->bnts", h, cache.cross_a[i]).astype(F32)
      scores = jnp.where(cross_allowed, scores, jnp.finfo(F32).min)
      w = jax.nn.softmax(scores, axis=-1).astype(h.dtype)
      if o.barrier:
        w = jax.lax.optimization_barrier(w)
      x = x + jnp.einsum("bnts,bnse->bte", w, cache.cross_b[i])
    else:
      q = _mm(h, ca["q"], o.qkv if o.qkv != "concat" else "dot", o.barrier)
      x = x + _attend(q, cache.cross_a[i], cache.cross_b[i], None, cross_allowed, ca["o"], o, o.layout)
    h = layers.rms_norm(x, lp["mlp_norm"], eps)
    x = x + _ff(lp["mlp"], h, cfg, o.mlp, o.barrier)
  x = layers.rms_norm(x, dec["final_norm"], eps)
  if cfg.scale_decoder_outputs:
    x = x * (cfg.d_model ** -0.5)
  if cfg.tie_word_embeddings:
    logits = jnp.einsum("btd,vd->btv", x, params["shared"]["embedding"])
  else:
    logits = jnp.einsum("btd,dv->btv", x, params["lm_head"])
  return logits.astype(F32), cache.replace(self_k=tuple(self_k), self_v=tuple(self_v), lengths=starts + t)


@dataclasses.dataclass(frozen=True)
class VariantDecoder:
  """A `Decoder` running a variant step (hashable)."""

  config: object
  opts: Opts

  def prefill(self, params, input_ids, input_lengths, cache_len):
    del input_lengths
    cache = init_cache(params, self.config, input_ids, cache_len, self.opts)
    return cache, jnp.full((input_ids.shape[0],), self.config.decoder_start_token_id, jnp.int32)

  def step(self, params, cache, tokens):
    return decode(params, self.config, cache, tokens, self.opts)
