"""The decoding loop: one `lax.while_loop` holding drafting, batched verification and per-row acceptance.

Each iteration, for every unfinished row:
  1. the draft proposes gamma tokens (a first call that catches it up with the accepted sequence: 2 tokens when
     a row accepted all gamma drafts last time, else 1; then a `lax.scan` of gamma - 1 single-token calls);
  2. the target scores [last token, x_1..x_gamma] in ONE call of gamma + 1 positions;
  3. `verify` keeps the longest acceptable prefix and picks the correction or bonus token;
  4. up to gamma + 1 tokens are written (cut at the first EOS and at max_new_tokens), and both caches are rolled
     back per row by setting their lengths.
With gamma == 0 and no draft this is plain autoregressive decoding through the same model code and caches.

Invariants at the top of an iteration (row b, L = lengths[b] tokens in sequences[b], start token included):
  - the last token sequences[b, L-1] has not been fed to the target: target_cache.lengths[b] == L - 1;
  - the draft has fed positions < draft_cache.lengths[b], which is L - 1 or L - 2 (L - 2 after it accepted all
    gamma drafts: it never saw x_gamma, REFERENCE.md pitfall 1), so its first call feeds the 2 tokens from there
    when any unfinished row is behind, and only the last token otherwise.
Buffers have gamma + 1 slots of slack, so no per-row write runs past the end (pitfall 6).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding import sampling, verify


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """Static settings: changing any of these compiles a new loop."""

  target: Any  # Decoder interface (e.g. models.t5.T5Decoder): .init(params, ids, cache_len), .step(params, cache, toks).
  draft: Any  # The draft's decoder interface, or None for plain decoding.
  gamma: int  # Draft tokens per iteration; 0 for plain decoding.
  max_new_tokens: int
  greedy: bool  # Temperature 0: argmax on both sides.
  filtering: bool  # Top-k or top-p active (needs a sort).
  eos_id: int
  pad_id: int
  start_id: int

  @property
  def cache_len(self) -> int:
    """Decoder positions per row: start token + max_new_tokens + slack for a gamma + 1 block."""
    return self.max_new_tokens + self.gamma + 1

  @property
  def seq_len(self) -> int:
    return self.cache_len + 1


@struct.dataclass
class LoopStats:
  """Counters per row, accumulated over the iterations in which the row was unfinished."""

  iterations: jax.Array  # [B] int32 target calls.
  drafted: jax.Array  # [B] int32 draft tokens proposed.
  accepted: jax.Array  # [B] int32 draft tokens accepted by verification (before EOS / max_new_tokens cuts).
  accepted_per_position: jax.Array  # [B, G] int32: how often draft position j was accepted.
  beta_sum: jax.Array  # [B] float32 sum of beta = sum_x min(p, q) over verified positions (see `beta_count`).
  beta_count: jax.Array  # [B] int32 verified positions: those up to and including the first rejection.


@struct.dataclass
class LoopState:
  sequences: jax.Array  # [B, seq_len] int32: start token, then generated tokens; garbage at >= lengths.
  lengths: jax.Array  # [B] int32 valid tokens in `sequences`, start token included.
  done: jax.Array  # [B] bool: EOS emitted or max_new_tokens reached; the row is frozen.
  target_cache: Any
  draft_cache: Any
  step: jax.Array  # [] int32 iteration counter (folded into the RNG).
  stats: LoopStats


def prefill(settings: LoopSettings, target_params, draft_params, input_ids: jax.Array):
  """Runs the encoders once and preallocates both caches. input_ids: [B, S]."""
  target_cache = settings.target.init(target_params, input_ids, settings.cache_len)
  draft_cache = None
  if settings.draft is not None:
    draft_cache = settings.draft.init(draft_params, input_ids, settings.cache_len)
  return target_cache, draft_cache


def _write_rows(buffer: jax.Array, block: jax.Array, offsets: jax.Array) -> jax.Array:
  """buffer [B, N], block [B, T], offsets [B] -> buffer with block[b] at buffer[b, offsets[b]:]."""
  return jax.vmap(lambda buf, blk, off: jax.lax.dynamic_update_slice_in_dim(buf, blk, off, axis=0))(
      buffer, block, offsets)


def _propose(settings: LoopSettings, key, logits, knobs):
  """One draft token per row from logits [B, V]: (tokens [B], q [B, V] or None when greedy)."""
  if settings.greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
  q = sampling.warp_probs(logits, knobs, settings.filtering)
  return sampling.sample(key, q), q


def _draft(settings: LoopSettings, params, cache, state: LoopState, knobs, key):
  """Proposes gamma tokens per row. Returns (tokens [B, G], q [B, G, V] or None, cache)."""
  dlen = cache.lengths

  def catch_up(cache):
    # Rows with dlen == L - 2 feed [x_gamma, last]: prediction at index 1. Rows with dlen == L - 1 feed
    # [last, junk]: prediction at index 0; the junk key at position L is overwritten by the next call.
    tokens = jnp.take_along_axis(state.sequences, dlen[:, None] + jnp.arange(2), axis=1)  # [B, 2]
    with jax.named_scope("draft_step"):
      logits, cache = settings.draft.step(params, cache, tokens)
    return jnp.take_along_axis(logits, (state.lengths - dlen - 1)[:, None, None], axis=1)[:, 0], cache

  def caught_up(cache):
    # Every unfinished row has dlen == L - 1: feed just the last token (a cheaper 1-token call).
    with jax.named_scope("draft_step"):
      logits, cache = settings.draft.step(params, cache,
                                          jnp.take_along_axis(state.sequences, dlen[:, None], axis=1))
    return logits[:, 0], cache

  behind = (dlen < state.lengths - 1) & ~state.done  # Rows that accepted all gamma drafts last iteration.
  first, cache = jax.lax.cond(jnp.any(behind), catch_up, caught_up, cache)
  cache = cache.replace(lengths=state.lengths)
  x1, q1 = _propose(settings, jax.random.fold_in(key, 0), first, knobs)

  def one_step(carry, j):
    cache, token = carry
    with jax.named_scope("draft_step"):
      logits, cache = settings.draft.step(params, cache, token[:, None])
    x, q = _propose(settings, jax.random.fold_in(key, j), logits[:, 0], knobs)
    return (cache, x), (x, q)

  (cache, _), (xs, qs) = jax.lax.scan(one_step, (cache, x1), jnp.arange(1, settings.gamma))
  tokens = jnp.concatenate([x1[:, None], xs.T], axis=1)
  q = None if settings.greedy else jnp.concatenate([q1[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
  return tokens, q, cache


def _iteration(settings: LoopSettings, target_params, draft_params, knobs, base_key, state: LoopState):
  gamma, batch = settings.gamma, state.lengths.shape[0]
  active = ~state.done
  draft_key, verify_key = jax.random.split(jax.random.fold_in(base_key, state.step))

  if settings.draft is not None:
    draft_tokens, q, draft_cache = _draft(settings, draft_params, state.draft_cache, state, knobs, draft_key)
  else:
    draft_tokens, q, draft_cache = jnp.zeros((batch, 0), jnp.int32), None, None

  last = jnp.take_along_axis(state.sequences, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
  with jax.named_scope("target_step"):  # Named scopes label the models' kernels in profiles.
    logits, target_cache = settings.target.step(target_params, state.target_cache,
                                                jnp.concatenate([last, draft_tokens], axis=1))  # [B, G+1, V]
  if settings.greedy:
    verdict = verify.accept_greedy(draft_tokens, logits)
  else:
    p = sampling.warp_probs(logits, knobs, settings.filtering)
    if q is None:
      q = jnp.zeros((batch, 0, p.shape[-1]), jnp.float32)
    verdict = verify.accept_sampled(verify_key, draft_tokens, q, p)
  n = verdict.num_accepted

  # The emitted block: accepted drafts, then the correction/bonus token at index n; cut at EOS and budget.
  positions = jnp.arange(gamma + 1)
  block = jnp.concatenate([draft_tokens, jnp.zeros((batch, 1), jnp.int32)], axis=1)
  block = jnp.where(positions == n[:, None], verdict.next_token[:, None], block)
  is_eos = (block == settings.eos_id) & (positions <= n[:, None])
  has_eos = jnp.any(is_eos, axis=1)
  emit = jnp.where(has_eos, jnp.argmax(is_eos, axis=1) + 1, n + 1)
  emit = jnp.minimum(emit, settings.max_new_tokens + 1 - state.lengths)
  emit = jnp.where(active, emit, 0).astype(jnp.int32)
  lengths = state.lengths + emit
  done = state.done | (active & (has_eos | (lengths > settings.max_new_tokens)))

  # Rollback: the target has now fed everything but the newest token; the draft has fed up to x_min(n, G-1).
  target_cache = target_cache.replace(lengths=lengths - 1)
  if draft_cache is not None:
    draft_cache = draft_cache.replace(
        lengths=jnp.minimum(state.lengths + jnp.minimum(n, gamma - 1), lengths - 1))

  a = active.astype(jnp.int32)
  verified = positions[:gamma] < jnp.minimum(n + 1, gamma)[:, None]  # [B, G] up to the first rejection.
  s = state.stats
  stats = LoopStats(
      iterations=s.iterations + a,
      drafted=s.drafted + gamma * a,
      accepted=s.accepted + n * a,
      accepted_per_position=s.accepted_per_position + (positions[:gamma] < n[:, None]) * a[:, None],
      beta_sum=s.beta_sum + jnp.sum(verdict.beta * verified, axis=1) * a,
      beta_count=s.beta_count + jnp.sum(verified, axis=1) * a,
  )
  return LoopState(sequences=_write_rows(state.sequences, block, state.lengths), lengths=lengths, done=done,
                   target_cache=target_cache, draft_cache=draft_cache, step=state.step + 1, stats=stats)


def run(settings: LoopSettings, target_params, draft_params, target_cache, draft_cache,
        knobs: sampling.SamplingKnobs, seed: jax.Array) -> LoopState:
  """Decodes until every row is done. Caches come from `prefill`; seed: [] uint32. Returns the final state."""
  key = jax.random.key(seed)  # Made inside the program: a host-side key costs ~1 ms per call on CPU.
  batch = target_cache.lengths.shape[0]
  gamma = settings.gamma
  sequences = jnp.full((batch, settings.seq_len), settings.pad_id, jnp.int32).at[:, 0].set(settings.start_id)
  zeros = jnp.zeros((batch,), jnp.int32)
  state = LoopState(
      sequences=sequences, lengths=zeros + 1, done=jnp.zeros((batch,), bool), target_cache=target_cache,
      draft_cache=draft_cache, step=jnp.int32(0),
      stats=LoopStats(iterations=zeros, drafted=zeros, accepted=zeros,
                      accepted_per_position=jnp.zeros((batch, gamma), jnp.int32),
                      beta_sum=jnp.zeros((batch,), jnp.float32), beta_count=zeros))

  def cond(state: LoopState):
    return jnp.any(~state.done) & (state.step <= settings.max_new_tokens)

  def body(state: LoopState):
    return _iteration(settings, target_params, draft_params, knobs, key, state)

  return jax.lax.while_loop(cond, body, state)
