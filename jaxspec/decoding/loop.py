"""The decoding loop: one `lax.while_loop` holding drafting, batched verification and per-row acceptance (for
draft models under "heuristic" / "adaptive", two inner loops within it: drafting and resting iterations).

The loop sees models only through `jaxspec.models.contract.Decoder` (prefill, step) and their caches'
`positions` / `rollback`: it imports no model family. Its own tokens live in `sequences`: position 0 holds the
first token the prefill returned (T5's decoder start token, a decoder-only prompt's last token), then the
generated tokens; a cache's `positions` count how many of them it has fed.

Each iteration, for every unfinished row:
  1. the drafter proposes k <= gamma tokens: a draft model (drafting.py: a catch-up call, then single-token
     calls) or prompt lookup (ngram.py); k = gamma always with schedule "constant" and a draft model, else k
     comes from the batch's schedule and fallback and the row's draft confidence (adaptive.py), or from the
     lookup;
  2. the target scores [last token, x_1..x_gamma] in ONE call of gamma + 1 positions (1 position when no row
     drafted anything: the iteration is then plain decoding). With a draft model under "heuristic" / "adaptive"
     the loop has two inner loops (`LoopSettings.phased`): drafting iterations (always gamma + 1 positions) while
     the batch drafts, resting ones (1 position, no draft call) while it rests; prompt lookup picks the width per
     iteration with a `lax.cond`;
  3. `verify` keeps the longest acceptable prefix of each row's k drafts and picks the correction or bonus token;
  4. up to k + 1 tokens are written (cut at the first EOS and at max_new_tokens), both caches are rolled back per
     row by setting their positions, and with `streaming` the new tokens go to the host (streaming.py).
With gamma == 0 and no draft this is plain autoregressive decoding through the same model code and caches.

Invariants at the top of an iteration (row b, L = lengths[b] tokens in sequences[b], first token included):
  - the last token sequences[b, L-1] has not been fed to the target: target_cache.positions[b] == L - 1;
  - a draft model has fed positions < draft_cache.positions[b] <= L - 1 (L - 2 after it accepted all its drafts:
    it never saw the last one, REFERENCE.md pitfall 1; less after iterations in which it drafted nothing);
  - choices of k use only what is known before the target scores the tokens (exact: adaptive.py);
  - a row's random draws depend only on its own key (from its seed) and the iteration number, never on other rows;
  - a finished row (EOS, max_new_tokens, or non-finite logits: `failed`) is frozen: nothing it emits is written.
Buffers have gamma + 1 slots of slack, so no per-row write runs past the end (pitfall 6).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding import adaptive, drafting, ngram, sampling, streaming, verify
from jaxspec.decoding.stats import LoopStats
from jaxspec.models.contract import Decoder


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """Static settings: changing any of these compiles a new loop."""

  target: Decoder
  draft: Decoder | ngram.NGramDraft | None  # None for plain decoding.
  gamma: int  # The most draft tokens per row and iteration; 0 for plain decoding.
  max_new_tokens: int
  greedy: bool  # Temperature 0: argmax on both sides.
  filtering: bool  # Top-k or top-p active (needs a sort).
  eos_ids: tuple[int, ...]  # Every id that ends a row.
  pad_id: int  # Fills `sequences` past each row's end.
  schedule: str = "constant"  # adaptive.SCHEDULES: how many tokens each row drafts.
  streaming: bool = False  # Send each iteration's tokens to the host (an ordered io_callback).

  @property
  def cache_len(self) -> int:
    """Loop positions per row: first token + max_new_tokens + slack for a gamma + 1 block."""
    return self.max_new_tokens + self.gamma + 1

  @property
  def seq_len(self) -> int:
    return self.cache_len + 1

  @property
  def ngram(self) -> bool:
    return isinstance(self.draft, ngram.NGramDraft)

  @property
  def variable(self) -> bool:
    """Rows may draft fewer than gamma tokens (then a 1-token target call replaces one with nothing drafted)."""
    return self.draft is not None and (self.schedule != "constant" or self.ngram)

  @property
  def phased(self) -> bool:
    """A draft model with a schedule that may rest: drafting and resting iterations run in two inner loops (`run`),
    each with one static target-call width, instead of a `lax.cond` per iteration on the width (through which XLA
    copies every cache leaf each iteration)."""
    return self.variable and not self.ngram


@struct.dataclass
class LoopState:
  sequences: jax.Array  # [B, seq_len] int32: first token, then generated tokens; pad id at >= lengths.
  lengths: jax.Array  # [B] int32 valid tokens in `sequences`, first token included.
  done: jax.Array  # [B] bool: EOS emitted, max_new_tokens reached or failed; the row is frozen.
  failed: jax.Array  # [B] bool: the target's logits held NaN or +inf for this row; its output stops there.
  target_cache: Any
  draft_cache: Any  # A draft model's cache, an ngram.NGramContext, or None.
  schedule: adaptive.ScheduleState | None  # Rows' histories (schedules other than "constant").
  keys: jax.Array  # [B] PRNG keys, one per row (from its seed); the iteration number is folded in each step.
  step: jax.Array  # [] int32 iteration counter.
  stats: LoopStats
  rest: jax.Array | None = None  # [] bool (phased loops): the batch rests in the next iteration (adaptive.limits).


def prefill(settings: LoopSettings, target_params, draft_params, input_ids: jax.Array, input_lengths: jax.Array):
  """Runs the encoders / prompt prefills once and preallocates both caches (or the n-gram context).

  Args:
    input_ids: [B, S] int32, right-padded; input_lengths: [B] int32.
  Returns:
    (target_cache, draft_cache or None, first_tokens [B] int32).
  """
  target_cache, first = settings.target.prefill(target_params, input_ids, input_lengths, settings.cache_len)
  draft_cache = None
  if settings.ngram:
    draft_cache = ngram.init_context(input_ids, input_lengths, settings.cache_len)
  elif settings.draft is not None:
    draft_cache, _ = settings.draft.prefill(draft_params, input_ids, input_lengths, settings.cache_len)
  return target_cache, draft_cache, first


def _fold(keys: jax.Array, data: int | jax.Array) -> jax.Array:
  """[B] keys -> [B] keys with `data` folded into each."""
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, data)


def _write_rows(buffer: jax.Array, block: jax.Array, offsets: jax.Array) -> jax.Array:
  """buffer [B, N], block [B, T], offsets [B] -> buffer with block[b] at buffer[b, offsets[b]:]."""
  return jax.vmap(lambda buf, blk, off: jax.lax.dynamic_update_slice_in_dim(buf, blk, off, axis=0))(
      buffer, block, offsets)


def _draft(settings: LoopSettings, params: Any, knobs: sampling.SamplingKnobs, spec: adaptive.SpeculationKnobs,
           state: LoopState, active: jax.Array, keys: jax.Array, phase: str | None = None):
  """This iteration's proposals: (tokens [B, G], q [B, G, V] or None, counts [B] (None: every row drafted G),
  drafting.Proposal or None, resting [B] or None). phase (settings.phased): "rest" drafts nothing, "draft" knows
  that the batch drafts (no `lax.cond` around the draft model's calls)."""
  batch, gamma = state.lengths.shape[0], settings.gamma
  if settings.draft is None:
    return jnp.zeros((batch, 0), jnp.int32), None, None, None, None
  if phase == "rest":
    return jnp.zeros((batch, gamma), jnp.int32), None, jnp.zeros((batch,), jnp.int32), None, active
  if settings.schedule == "constant":
    limit, resting = jnp.where(active, gamma, 0).astype(jnp.int32), None
  else:
    limit, resting = adaptive.limits(settings.schedule, gamma, spec, state.schedule, active)
  if settings.ngram:
    tokens, found = ngram.propose(settings.draft, state.draft_cache, gamma)
    return tokens, None, jnp.minimum(found, limit), None, resting
  if settings.schedule == "constant":
    p = drafting.propose_fixed(settings, params, state.draft_cache, state.sequences, state.lengths, state.done,
                               knobs, keys)
    return p.tokens, p.q, None, p, None
  p = drafting.propose_variable(settings, params, state.draft_cache, state.sequences, state.lengths, limit, knobs,
                                spec.draft_confidence, keys, drafts=phase == "draft")
  return p.tokens, p.q, p.counts, p, resting


def _verify(settings: LoopSettings, params: Any, cache: Any, last: jax.Array, tokens: jax.Array,
            q: jax.Array | None, counts: jax.Array | None, knobs: sampling.SamplingKnobs, keys: jax.Array,
            phase: str | None = None):
  """The target's call and verdict: (verify.Verdict with beta [B, G], bad [B] bool, target cache).

  last [B, 1], tokens [B, G], q [B, G, V] or None (deterministic proposals), counts [B] or None (all G); phase
  "rest" / "draft" fixes the call's width at 1 / gamma + 1 (else: picked per iteration)."""
  gamma = settings.gamma

  def score(cache, width: int):
    with jax.named_scope("target_step"):  # Named scopes label the models' kernels in profiles.
      logits, cache = settings.target.step(params, cache, jnp.concatenate([last, tokens[:, :width - 1]], axis=1))
    # Non-finite logits (NaN or +inf; -inf is a legitimately excluded token) fail the row: it stops here, and
    # nothing drawn from them is written.
    bad = jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=(1, 2))
    drafted = counts if width > 1 else None
    if settings.greedy:
      verdict = verify.accept_greedy(tokens[:, :width - 1], logits, drafted)
    else:
      p = sampling.warp_probs(logits, knobs, settings.filtering)
      q_used = q[:, :width - 1] if q is not None else (None if settings.ngram else p[:, :0])
      verdict = verify.accept_sampled(keys, tokens[:, :width - 1], q_used, p, drafted)
    beta = jnp.pad(verdict.beta, ((0, 0), (0, gamma + 1 - width)))
    return verdict.replace(beta=beta), bad, cache

  if not settings.variable or phase == "draft":
    return score(cache, gamma + 1)
  if phase == "rest":
    return score(cache, 1)
  return jax.lax.cond(jnp.any(counts > 0), lambda c: score(c, gamma + 1), lambda c: score(c, 1), cache)


def _iteration(settings: LoopSettings, target_params: Any, draft_params: Any, knobs: sampling.SamplingKnobs,
               spec: adaptive.SpeculationKnobs, stream_id: jax.Array | None, state: LoopState,
               phase: str | None = None) -> LoopState:
  gamma, batch = settings.gamma, state.lengths.shape[0]
  active = ~state.done
  step_keys = _fold(state.keys, state.step)
  draft_keys, verify_keys = _fold(step_keys, 0), _fold(step_keys, 1)

  tokens, q, counts, proposal, resting = _draft(settings, draft_params, knobs, spec, state, active, draft_keys,
                                                phase)
  last = jnp.take_along_axis(state.sequences, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
  verdict, bad, target_cache = _verify(settings, target_params, state.target_cache, last, tokens, q, counts, knobs,
                                       verify_keys, phase)
  failed = state.failed | (active & bad)
  active = active & ~bad
  n = verdict.num_accepted
  drafted = jnp.full((batch,), gamma, jnp.int32) if counts is None else counts

  # The emitted block: accepted drafts, then the correction/bonus token at index n; cut at EOS and budget.
  positions = jnp.arange(gamma + 1)[None]  # [1, G + 1]
  block = jnp.concatenate([tokens, jnp.zeros((batch, 1), jnp.int32)], axis=1)
  block = jnp.where(positions == n[:, None], verdict.next_token[:, None], block)
  is_eos = jnp.isin(block, jnp.asarray(settings.eos_ids, jnp.int32)) & (positions <= n[:, None])
  has_eos = jnp.any(is_eos, axis=1)
  emit = jnp.where(has_eos, jnp.argmax(is_eos, axis=1) + 1, n + 1)
  emit = jnp.minimum(emit, settings.max_new_tokens + 1 - state.lengths)
  emit = jnp.where(active, emit, 0).astype(jnp.int32)
  lengths = state.lengths + emit
  done = state.done | failed | (active & (has_eos | (lengths > settings.max_new_tokens)))
  # Frozen rows write their own tokens back (a no-op), so nothing past a row's end changes.
  block = jnp.where(positions < emit[:, None], block, settings.pad_id)

  # Rollback: the target has now fed everything but the newest token; the draft what it fed and was accepted.
  target_cache = target_cache.rollback(lengths - 1)
  if settings.ngram:
    draft_cache = ngram.append(state.draft_cache, block, emit)
  elif proposal is not None:
    draft_cache = drafting.settle(proposal.cache, proposal, state.lengths, lengths, n)
  else:
    draft_cache = state.draft_cache  # None, or a resting iteration's (it fed nothing)
  schedule = state.schedule
  if schedule is not None:
    schedule = adaptive.update(schedule, gamma, jnp.where(active, drafted, 0), n, verdict.beta, resting, active)
  if settings.streaming:
    streaming.emit(stream_id, state.step, block, emit)
  return LoopState(sequences=_write_rows(state.sequences, block, state.lengths), lengths=lengths, done=done,
                   failed=failed, target_cache=target_cache, draft_cache=draft_cache, schedule=schedule,
                   keys=state.keys, step=state.step + 1,
                   stats=state.stats.add(active, drafted, n, verdict.beta, resting))


def run(settings: LoopSettings, target_params, draft_params, target_cache, draft_cache, first_tokens: jax.Array,
        knobs: sampling.SamplingKnobs, seeds: jax.Array, row_ids: jax.Array,
        spec: adaptive.SpeculationKnobs | None = None, stream_id: jax.Array | None = None) -> LoopState:
  """Decodes until every row is done.

  Args:
    target_cache, draft_cache, first_tokens: from `prefill`.
    seeds: [B] uint32, one per row; row_ids: [B] int32 folded into each row's key (the row index when one seed
      is shared by the batch, so that rows differ; 0 with per-row seeds, so that a row depends on its seed only).
    spec: the runtime speculation knobs (defaults when None; only schedules other than "constant" read them).
    stream_id: [] int32 from `streaming.register` (with settings.streaming).
  Returns:
    The final state.
  """
  # Keys are made inside the program: host-side keys cost ~1 ms per call on CPU.
  keys = jax.vmap(lambda s, r: jax.random.fold_in(jax.random.key(s), r))(seeds, row_ids)
  spec = adaptive.SpeculationKnobs.create() if spec is None else spec
  batch = target_cache.lengths.shape[0]
  sequences = jnp.full((batch, settings.seq_len), settings.pad_id, jnp.int32).at[:, 0].set(first_tokens)
  no = jnp.zeros((batch,), bool)
  schedule = None
  if settings.draft is not None and settings.schedule != "constant":
    schedule = adaptive.ScheduleState.create(batch, settings.gamma, spec)
  state = LoopState(
      sequences=sequences, lengths=jnp.ones((batch,), jnp.int32), done=no, failed=no, target_cache=target_cache,
      draft_cache=draft_cache, schedule=schedule, keys=keys, step=jnp.int32(0),
      stats=LoopStats.create(batch, settings.gamma))

  def cond(state: LoopState):
    return jnp.any(~state.done) & (state.step <= settings.max_new_tokens)

  def step(phase: str | None):
    return lambda state: _iteration(settings, target_params, draft_params, knobs, spec, stream_id, state, phase)

  if not settings.phased:
    return jax.lax.while_loop(cond, step(None), state)

  def flagged(state: LoopState) -> LoopState:
    """The state with its next decision: whether the batch rests (adaptive.limits: all active rows or none).
    Stored once, so that both inner loops' conditions read the same value and one of them always advances."""
    rest = adaptive.limits(settings.schedule, settings.gamma, spec, state.schedule, ~state.done)[1]
    return state.replace(rest=jnp.any(rest))

  def phase(name: str):
    return lambda state: flagged(step(name)(state))

  def phases(state: LoopState):
    state = jax.lax.while_loop(lambda s: cond(s) & ~s.rest, phase("draft"), state)
    return jax.lax.while_loop(lambda s: cond(s) & s.rest, phase("rest"), state)

  return jax.lax.while_loop(cond, phases, flagged(state))
