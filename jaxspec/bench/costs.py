"""The paper's cost ratios, timed: c, r and the encoders (medians after warm-up; see jaxspec.bench.timing).

c = draft decoder step / target decoder step (1 token each); r = target step on gamma + 1 tokens / on 1 token.
Both are measured in isolation, on caches filled to a typical length, with compilation excluded. c_alternating
times the draft's steps between target calls, as the decoding loop runs them (on a CPU the target's pass evicts
the draft's weights from the caches, which a tight loop of draft steps never sees). encoder_time is the work a
decoding call does once, outside the loop. Models are driven through their `Decoder` (any family).

A feature head (`jaxspec.FeatureHead`, EAGLE-3) drafts from the target's hidden states: its step is one head call
(a decoder layer and the lm_head; `head_step_time`), and its alternating cost is what it adds to a loop iteration
beside the target's plain verify call: the target's features (`step(..., layers=...)` instead of a plain `step`), the re-feed of
the verified positions (`settle`'s one `feed` call) and the chain (`head_round_time`), per draft token. Its
once-per-call work is its prefill over the prompt's features (`head_prefill_time`).
"""

from __future__ import annotations

import functools
import statistics
from typing import Sequence

import jax
import jax.numpy as jnp

from jaxspec.decoding.drafters import registry
from jaxspec.decoding.drafters.head_drafter import HeadDrafter
from jaxspec.models.loaded import FeatureHead, Model
from jaxspec.models.contract import Decoder
from jaxspec.models.eagle3 import HeadInput
from jaxspec.models.hf_table import get_path
from jaxspec.bench.timing import median_time


@functools.partial(jax.jit, static_argnums=0)
def _steps(decoder: Decoder, params, cache, tokens, n_calls: int = 8):
  """n_calls decoder calls on the same cache position (each call is one real decoder step)."""
  def body(_, carry):
    # The tokens depend on the carry (by a term that is always 0) so XLA cannot hoist the call out of the loop.
    fed = tokens + (carry[:, None] > 1e30).astype(tokens.dtype)
    logits = decoder.step(params, cache, fed).logits
    return carry + logits[:, 0, 0]
  return jax.lax.fori_loop(0, n_calls, body, jnp.zeros(tokens.shape[0], jnp.float32))


@functools.partial(jax.jit, static_argnums=(0, 1, 6))
def _alternating(t_dec: Decoder, d_dec: Decoder, t_params, d_params, t_cache, d_cache, gamma: int,
                 n_rounds: int):
  """n_rounds of [one target call on gamma + 1 tokens, then gamma draft calls on 1 token]: the loop's pattern."""
  batch = t_cache.lengths.shape[0]

  def body(_, carry):
    zero = (carry[:, None] > 1e30).astype(jnp.int32)  # always 0; keeps every call inside the loop
    logits = t_dec.step(t_params, t_cache, jnp.full((batch, gamma + 1), 5, jnp.int32) + zero).logits
    carry = carry + logits[:, 0, 0]
    for _ in range(gamma):
      logits = d_dec.step(d_params, d_cache,
                          jnp.full((batch, 1), 5, jnp.int32) + (carry[:, None] > 1e30).astype(jnp.int32)).logits
      carry = carry + logits[:, 0, 0]
    return carry
  return jax.lax.fori_loop(0, n_rounds, body, jnp.zeros(batch, jnp.float32))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _prefill(decoder: Decoder, params, ids, cache_len: int):
  return decoder.prefill(params, ids, jnp.full((ids.shape[0],), ids.shape[1], jnp.int32), cache_len).cache


def _room(context: int, tokens_per_call: int) -> int:
  """Cache positions for `context` and the calls' tokens: a power of two, so the timings of several gammas share
  one compiled prefill."""
  return 1 << (context + tokens_per_call + 8 - 1).bit_length()


def _filled_cache(model: Model, batch: int, tokens_per_call: int, prompt_len: int, context: int):
  """A cache after an input of prompt_len tokens and `context` of the loop's positions (filled with junk)."""
  ids = jnp.full((batch, prompt_len), 5, jnp.int32)
  cache = _prefill(model.decoder(), model.params, ids, _room(context, tokens_per_call))
  return cache.rollback(jnp.full((batch,), context, jnp.int32))


def alternating_round_time(target: Model, draft: Model | FeatureHead, gamma: int, batch: int, prompt_len: int = 16,
                           context: int = 16, repeats: int = 5, n_rounds: int = 8) -> float:
  """Seconds per [target call on gamma + 1 tokens + gamma draft calls] when the two alternate (median); for a
  feature head, `head_round_time`.

  On a CPU the target's pass evicts the draft's weights from the caches, so a draft step costs more here than in
  a tight loop of draft steps: the difference from `decoder_step_time` is the alternation's own cost.
  """
  if isinstance(draft, FeatureHead):
    return head_round_time(target, draft, gamma, batch, prompt_len, context, repeats, n_rounds)
  t_cache = _filled_cache(target, batch, gamma + 1, prompt_len, context)
  d_cache = _filled_cache(draft, batch, 1, prompt_len, context)
  return median_time(lambda: _alternating(target.decoder(), draft.decoder(), target.params, draft.params, t_cache,
                                          d_cache, gamma, n_rounds).block_until_ready(), repeats) / n_rounds


def decoder_step_time(model: Model, batch: int, tokens_per_call: int, prompt_len: int = 16, context: int = 16,
                      repeats: int = 5, n_calls: int = 16) -> float:
  """Seconds per decoder call feeding `tokens_per_call` tokens per row at position `context` (median)."""
  cache = _filled_cache(model, batch, tokens_per_call, prompt_len, context)
  tokens = jnp.full((batch, tokens_per_call), 5, jnp.int32)
  return median_time(lambda: _steps(model.decoder(), model.params, cache, tokens, n_calls).block_until_ready(),
                     repeats) / n_calls


def encoder_time(model: Model, batch: int, prompt_len: int, cache_len: int = 72, repeats: int = 5) -> float:
  """Seconds per call of the work done once per decoding call: the prefill on [batch, prompt_len] tokens (T5:
  the encoder, the cross-attention keys and values) and the caches' allocation (median)."""
  ids = jnp.full((batch, prompt_len), 5, jnp.int32)
  decoder = model.decoder()
  return median_time(lambda: jax.block_until_ready(_prefill(decoder, model.params, ids, cache_len)), repeats)


def _head_parts(target: Model, head: FeatureHead) -> tuple[HeadDrafter, dict]:
  """The drafter and its params as `jaxspec.generate` builds them (CheckpointError when the head does not fit)."""
  return registry.head_drafter(target, head)


def _dtype(target: Model):
  return get_path(target.params, target.family.embedding_path).dtype


def _features(target: Model, drafter: HeadDrafter, batch: int, positions: int) -> jax.Array:
  """[batch, positions, F] features of the width the head fuses (their values do not change a call's time)."""
  width = len(drafter.feature_layers) * drafter.head.config.target_hidden_size
  return jnp.full((batch, positions, width), 0.1, _dtype(target))


def _encoder(target: Model, drafter: HeadDrafter, batch: int, prompt_len: int):
  """(encoded [batch, prompt_len, D], mask) for a drafter that reads the target's encoder output, else None."""
  if not getattr(drafter, "reads_encoder", False):
    return None
  width = drafter.head.config.encoder_hidden_size
  return (jnp.full((batch, prompt_len, width), 0.1, _dtype(target)), jnp.ones((batch, prompt_len), bool))


@functools.partial(jax.jit, static_argnums=(0, 5))
def _head_init(drafter: HeadDrafter, params, ids, lengths, features, cache_len: int, encoder=None):
  if encoder is None:
    return drafter.init(params, ids, lengths, cache_len, features)
  return drafter.init(params, ids, lengths, cache_len, features, encoder=encoder)


def _head_prompt(target: Model, drafter: HeadDrafter, batch: int, prompt_len: int):
  """(ids, lengths, features, encoder) of a prompt of prompt_len tokens as the loop's prefill gives them to the
  head: a T5 target's decoder starts empty (features of 0 positions) and its head gets the encoder's output."""
  ids = jnp.full((batch, prompt_len), 5, jnp.int32)
  lengths = jnp.full((batch,), prompt_len, jnp.int32)
  decoder = target.decoder()
  shaped = jax.eval_shape(lambda: decoder.prefill(target.params, ids, lengths, _room(prompt_len, 1),
                                                  layers=drafter.feature_layers).features)
  features = _features(target, drafter, batch, shaped.shape[1])
  return ids, lengths, features, _encoder(target, drafter, batch, prompt_len)


def _filled_head(target: Model, drafter: HeadDrafter, params: dict, batch: int, tokens_per_call: int,
                 prompt_len: int, context: int):
  """The head's (cache, hidden [B, H]) after a prompt of prompt_len positions and `context` of the loop's."""
  ids, lengths, features, encoder = _head_prompt(target, drafter, batch, prompt_len)
  state = _head_init(drafter, params, ids, lengths, features, _room(context, tokens_per_call), encoder)
  return state.cache.rollback(jnp.full((batch,), context, jnp.int32)), state.hidden


@functools.partial(jax.jit, static_argnums=(0, 5))
def _head_steps(drafter: HeadDrafter, params, cache, hidden, tokens, n_calls: int = 8):
  """n_calls head steps (a layer and the logits over the target vocabulary) on the same cache position."""
  def body(_, carry):
    fed = tokens + (carry[:, None] > 1e30).astype(tokens.dtype)  # always 0: keeps the call inside the loop
    res = drafter.head.step(params, cache, HeadInput(fed, hidden[:, None]))
    logits, prenorm = res.logits, res.features
    return carry + jnp.max(logits[:, 0], axis=-1) + prenorm[:, 0, 0].astype(jnp.float32)
  return jax.lax.fori_loop(0, n_calls, body, jnp.zeros(tokens.shape[0], jnp.float32))


@functools.partial(jax.jit, static_argnums=(0, 1, 6, 7))
def _head_alternating(t_dec: Decoder, drafter: HeadDrafter, t_params, h_params, t_cache, h_cache, gamma: int,
                      n_rounds: int):
  """n_rounds of the loop's pattern with a head: the target's verify call on gamma + 1 tokens with features, the
  head's re-feed of them (`feed`), the first draft's logits and gamma - 1 head steps."""
  batch = t_cache.lengths.shape[0]
  head, hp = drafter.head, h_params["head"]

  def body(_, carry):
    zero = (carry[:, None] > 1e30).astype(jnp.int32)  # always 0; keeps every call inside the loop
    block = jnp.full((batch, gamma + 1), 5, jnp.int32) + zero
    verified = t_dec.step(t_params, t_cache, block, layers=drafter.feature_layers)
    carry = carry + verified.logits[:, 0, 0]
    fed = head.step(h_params, h_cache, HeadInput(block, head.fuse(hp, verified.features)))  # logits unread
    prenorm, cache = fed.features, fed.cache
    h = prenorm[:, -1]  # the chain starts from the re-fed block's output, as propose does after settle
    carry = carry + jnp.max(head.logits(hp, h[:, None])[:, 0], axis=-1)
    for _ in range(gamma - 1):
      fed = block[:, :1] + (carry[:, None] > 1e30).astype(jnp.int32)
      res = head.step(h_params, cache, HeadInput(fed, h[:, None]))
      h, cache = res.features[:, 0], res.cache
      carry = carry + jnp.max(res.logits[:, 0], axis=-1)
    return carry
  return jax.lax.fori_loop(0, n_rounds, body, jnp.zeros(batch, jnp.float32))


def head_step_time(target: Model, head: FeatureHead, batch: int, prompt_len: int = 16, context: int = 16,
                   repeats: int = 5, n_calls: int = 16) -> float:
  """Seconds per head step (one token per row at position `context`: what each chained draft token costs; median)."""
  drafter, params = _head_parts(target, head)
  cache, hidden = _filled_head(target, drafter, params, batch, 1, prompt_len, context)
  tokens = jnp.full((batch, 1), 5, jnp.int32)
  return median_time(lambda: _head_steps(drafter, params, cache, hidden, tokens, n_calls).block_until_ready(),
                     repeats) / n_calls


def head_round_time(target: Model, head: FeatureHead, gamma: int, batch: int, prompt_len: int = 16,
                    context: int = 16, repeats: int = 5, n_rounds: int = 8) -> float:
  """Seconds per loop iteration with a head drafting gamma tokens (median): the target's verify call on gamma + 1
  tokens with features, the head's re-feed of those positions, the first draft's logits and gamma - 1 steps.
  Minus the target's plain verify call, divided by gamma, it is the head's cost per draft token as the loop
  pays it (`cost_table`'s c_alternating)."""
  drafter, params = _head_parts(target, head)
  t_cache = _filled_cache(target, batch, gamma + 1, prompt_len, context)
  h_cache, _ = _filled_head(target, drafter, params, batch, 2 * gamma + 1, prompt_len, context)
  return median_time(lambda: _head_alternating(target.decoder(), drafter, target.params, params, t_cache, h_cache,
                                               gamma, n_rounds).block_until_ready(), repeats) / n_rounds


def head_prefill_time(target: Model, head: FeatureHead, batch: int, prompt_len: int, cache_len: int = 72,
                      repeats: int = 5) -> float:
  """Seconds per call of the head's once-per-call work (median): its prefill over the prompt's features (a T5
  target's decoder starts empty, and the head's cache with it: only the allocation)."""
  drafter, params = _head_parts(target, head)
  ids, lengths, features, encoder = _head_prompt(target, drafter, batch, prompt_len)
  return median_time(lambda: jax.block_until_ready(_head_init(drafter, params, ids, lengths, features, cache_len,
                                                              encoder)), repeats)


def draft_step_time(target: Model, draft: Model | FeatureHead, batch: int, repeats: int = 5) -> float:
  """Seconds per draft token in a tight loop: a draft model's 1-token decoder step, a head's step."""
  if isinstance(draft, FeatureHead):
    return head_step_time(target, draft, batch, repeats=repeats)
  return decoder_step_time(draft, batch, 1, repeats=repeats)


def draft_prefill_time(target: Model, draft: Model | FeatureHead, batch: int, prompt_len: int,
                       repeats: int = 5) -> float:
  """Seconds per decoding call of the draft's once-per-call work (`encoder_time`, `head_prefill_time`)."""
  if isinstance(draft, FeatureHead):
    return head_prefill_time(target, draft, batch, prompt_len, repeats=repeats)
  return encoder_time(draft, batch, prompt_len, repeats=repeats)


def cost_ratios(target: Model, draft: Model | FeatureHead, gamma: int, batch: int = 1, repeats: int = 5,
                rounds: int = 5) -> dict:
  """c and r for one gamma: see `cost_table`."""
  return cost_table(target, draft, [gamma], batch, repeats, rounds)[gamma]


def cost_table(target: Model, draft: Model | FeatureHead, gammas: Sequence[int], batch: int = 1, repeats: int = 5,
               rounds: int = 5, alternating: bool = True) -> dict:
  """{gamma: {target_step_s, target_verify_s, draft_step_s, c, r, draft_step_alternating_s, c_alternating}}.

  The target's 1-token step, its (gamma+1)-token step per gamma, the draft's 1-token step (a head's step:
  `draft_step_time`), and the alternating pattern per gamma are timed in `rounds` interleaved rounds; each is the
  median over its rounds, so a slow spell of the machine does not land on one of them only. c and r are the
  paper's ratios of isolated step times; c_alternating is the draft's step cost when it runs between target
  calls, as in the decoding loop (alternating=False skips that pattern and reports c_alternating = c; so does a
  round whose draft share the noise hid: the round no slower than the verify call alone).
  """
  runs: dict = {"t1": [], "d1": [], **{("tg", g): [] for g in gammas}, **{("alt", g): [] for g in gammas}}
  for _ in range(rounds):
    runs["t1"].append(decoder_step_time(target, batch, 1, repeats=repeats))
    runs["d1"].append(draft_step_time(target, draft, batch, repeats=repeats))
    for g in gammas:
      runs[("tg", g)].append(decoder_step_time(target, batch, g + 1, repeats=repeats))
      if alternating:
        runs[("alt", g)].append(alternating_round_time(target, draft, g, batch, repeats=repeats))
  med = {k: statistics.median(v) for k, v in runs.items() if v}
  t1, d1 = med["t1"], med["d1"]
  table = {}
  for g in gammas:
    tg = med[("tg", g)]
    # The alternating round minus the verify call is the draft's share; when the machine's noise leaves none
    # (a draft far cheaper than the target, a busy machine), the isolated step is the estimate, never 0.
    d_alt = (med[("alt", g)] - tg) / g if alternating and med[("alt", g)] > tg else d1
    table[g] = {"target_step_s": t1, "target_verify_s": tg, "draft_step_s": d1, "c": d1 / t1, "r": tg / t1,
                "draft_step_alternating_s": d_alt, "c_alternating": d_alt / t1}
  return table
