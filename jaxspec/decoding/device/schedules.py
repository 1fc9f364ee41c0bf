"""How many tokens each row drafts per iteration: the schedules, the fallback to plain decoding, their knobs.

`gamma` is the most draft tokens a row proposes in one iteration (static: it sets the verify call's width).
Within it, `Speculation.schedule` (its values: settings.SCHEDULES) picks this iteration's draft length:

  "constant"   every row drafts gamma tokens every iteration (the loop as it always was).
  "heuristic"  transformers' assisted-generation rule: a row's length starts at gamma and moves +2 after an
               iteration in which all its drafts were accepted, -1 otherwise, clipped to [1, gamma].
  "adaptive"   Theorem 3.8: from each row's running acceptance estimate a (below), the length k in [1, gamma]
               that maximises the expected tokens per unit of cost
                   sum over rows of (1 + a + ... + a^k), divided by (1 + k * draft_cost),
               draft_cost being c, the cost of a draft step relative to a verify call (a runtime knob; 0 for
               NGramDraft, whose proposals cost nothing). A high estimate gives long drafts, a low one short ones.

The decision is the batch's, from every active row's history: the draft steps run for the whole batch and the
verify call's width is the batch's, so a row drafting less than the others would save nothing and only give up
tokens (docs/adaptive.md has the measurement). So
"heuristic" drafts the longest active row's length and "adaptive" the k above, for every active row; at batch 1
this is the row's own rule. Prompt lookup (NGramDraft) still proposes per row what it finds. Padding rows
(a short last batch filled with copies, mesh padding) count like the rows they copy: a matter of speed only.

Knobs (runtime: changing them never recompiles; for the first two 0 = off, and "constant" refuses them):
  draft_confidence  a row stops drafting after a token whose draft distribution has a top probability below it
                    (transformers' assistant_confidence_threshold, with the top probability: at temperature 0 the
                    proposed token's own); the token itself is still verified. Per row; the batch's draft loop
                    stops when every row has stopped.
  fallback_alpha    when the mean estimate of the active rows falls below it, the batch rests: no draft call, a
                    1-token target call (plain decoding), and it probes again, with its scheduled length, after
                    `probe_interval` resting iterations; each probe that leaves it resting doubles the next
                    interval (up to 2^MAX_BACKOFF times), a drafting iteration outside a probe resets it. A useless
                    draft then costs a few probes in all.
  prior_alpha       what a row's estimate starts from: PRIOR_POSITIONS pseudo-positions of beta = prior_alpha.
                    1 (the default) is optimistic: every row starts by drafting. A caller who has measured the
                    draft's acceptance on this kind of input (jaxspec.tune does) passes it, so that a useless
                    draft rests from the first iteration and a good one is not sent resting by an early miss.
                    A batch that starts below fallback_alpha has in effect failed its calibration: its first
                    probe comes after probe_interval * 2**COLD_BACKOFF iterations (a probe at batch 4 costs
                    about two plain iterations; docs/adaptive.md has what each backoff measured).

The running estimate: a = S / N over verified draft positions, S and N sums of beta (= sum_x min(p, q); at
temperature 0, 1 when the draft's token is the target's argmax) and of 1, each decayed by ALPHA_DECAY per new
verified position (a memory of ~10 positions), both starting from the prior: one early rejection moves a from
prior_alpha to 0.82 of it rather than to 0 (without a prior, a good draft's first miss sent its row to rest for
most of a short output; docs/adaptive.md has the measurements behind PRIOR_POSITIONS).

Exactness: every input of these rules is known before the target scores the tokens being verified: the rows' past
verdicts (a, the heuristic's length, the resting counters), the knobs, and the draft's own probabilities while it
drafts. Another row's past verdicts are as much "the past" as the row's own: its draws are independent of this
iteration's. A rule that looked at the target's verdict for the tokens being verified would bias the output
(tests/decoding/test_sampling_lossless.py shows one failing).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


ALPHA_DECAY = 0.9  # per verified position, in the running acceptance estimate
DEFAULT_DRAFT_COST = 0.05  # c for a draft model when none is given (CPU ~0.03, H100 ~0.06 for T5-small pairs)
PRIOR_POSITIONS = 5.0  # pseudo-positions of beta = prior_alpha the estimate starts from (decayed like real ones)
MAX_BACKOFF = 4  # the probe interval doubles after each failed probe, up to probe_interval * 2**4
COLD_BACKOFF = 3  # a batch whose prior is already below fallback_alpha starts with this many failed probes


@struct.dataclass
class SpeculationKnobs:
  """Per-call speculation values: arrays, so changing them never recompiles (see the module docstring)."""

  draft_confidence: jax.Array  # [] float32 in [0, 1), 0 = off.
  fallback_alpha: jax.Array  # [] float32 in [0, 1], 0 = off.
  probe_interval: jax.Array  # [] int32 >= 1: resting iterations before the batch probes (drafts) again.
  draft_cost: jax.Array  # [] float32 >= 0: c in the "adaptive" rule.
  prior_alpha: jax.Array  # [] float32 in [0, 1]: the estimate before any verified position.

  @classmethod
  def create(cls, draft_confidence: float = 0.0, fallback_alpha: float = 0.0, probe_interval: int = 4,
             draft_cost: float = DEFAULT_DRAFT_COST, prior_alpha: float = 1.0) -> "SpeculationKnobs":
    return cls(draft_confidence=np.float32(draft_confidence), fallback_alpha=np.float32(fallback_alpha),
               probe_interval=np.int32(probe_interval), draft_cost=np.float32(draft_cost),
               prior_alpha=np.float32(prior_alpha))


@struct.dataclass
class ScheduleState:
  """Each row's history, as the schedules read it (only past verdicts)."""

  beta_sum: jax.Array  # [B] float32 decayed sum of beta over verified positions (the prior's included).
  beta_count: jax.Array  # [B] float32 decayed count of verified positions (the prior's included).
  length: jax.Array  # [B] int32 the heuristic's current limit, in [1, G].
  idle: jax.Array  # [B] int32 consecutive iterations spent resting (fallback).
  probes: jax.Array  # [B] int32 probes since the row last drafted outside a probe (its backoff exponent).

  @classmethod
  def create(cls, batch: int, gamma: int, knobs: SpeculationKnobs | None = None) -> "ScheduleState":
    """Every row at the prior; a draft whose prior is below fallback_alpha (calibrated as losing) starts resting
    with COLD_BACKOFF failed probes behind it (first probe after probe_interval * 2**COLD_BACKOFF iterations)."""
    knobs = SpeculationKnobs.create() if knobs is None else knobs
    count = jnp.full((batch,), PRIOR_POSITIONS, jnp.float32)
    state = cls(beta_sum=count * jnp.asarray(knobs.prior_alpha, jnp.float32), beta_count=count,
                length=jnp.full((batch,), gamma, jnp.int32), idle=jnp.zeros((batch,), jnp.int32),
                probes=jnp.zeros((batch,), jnp.int32))
    cold = (knobs.fallback_alpha > 0) & (state.alpha < knobs.fallback_alpha)  # the estimate `limits` compares
    return state.replace(probes=jnp.where(cold, COLD_BACKOFF, 0).astype(jnp.int32))

  @property
  def alpha(self) -> jax.Array:
    """[B] running acceptance estimate; prior_alpha before any verified position."""
    return jnp.where(self.beta_count > 0, self.beta_sum / jnp.maximum(self.beta_count, 1e-30), 1.0)


def _expected_tokens(alpha: jax.Array, gamma: int) -> jax.Array:
  """[B, G]: 1 + a + ... + a^k for k = 1..G, per row (Theorem 3.8's expected tokens per iteration)."""
  a = jnp.clip(alpha, 0.0, 1.0)[:, None]
  return 1.0 + jnp.cumsum(a ** jnp.arange(1, gamma + 1)[None], axis=1)


def theory_length(alpha: jax.Array, draft_cost: jax.Array, gamma: int, rows: jax.Array | None = None) -> jax.Array:
  """The k in [1, G] maximising sum over rows of (1 + a + ... + a^k), over (1 + k c) (Theorem 3.8); ties: the
  shortest. alpha [B]; rows [B] bool, the rows that count (None: each row alone). Returns [B] int32: each row's
  own k when rows is None, else the batch's k in every entry."""
  expected = _expected_tokens(alpha, gamma)  # [B, G]
  if rows is not None:
    expected = jnp.broadcast_to(jnp.sum(jnp.where(rows[:, None], expected, 0.0), axis=0), expected.shape)
  value = expected / (1.0 + jnp.arange(1, gamma + 1)[None] * draft_cost)
  return (jnp.argmax(value, axis=1) + 1).astype(jnp.int32)


def limits(schedule: str, gamma: int, knobs: SpeculationKnobs, state: ScheduleState,
           active: jax.Array) -> tuple[jax.Array, jax.Array]:
  """This iteration's most draft tokens per row, from the past only: (limit [B] int32 in [0, G], resting [B] bool).

  One decision for the batch (the module docstring): every active row gets the same length, or the batch rests
  (fallback): then every active row is resting and gets 0, unless its idle count reached its interval
  (probe_interval * 2**min(probes, MAX_BACKOFF)): a probe, and the batch drafts. Finished rows get 0.
  """
  if schedule == "heuristic":
    scheduled = jnp.max(jnp.where(active, state.length, 1))
  elif schedule == "adaptive":
    scheduled = theory_length(state.alpha, knobs.draft_cost, gamma, active)[0]
  else:
    raise ValueError(f"no limits for schedule {schedule!r}")
  mean = jnp.sum(jnp.where(active, state.alpha, 0.0)) / jnp.maximum(jnp.sum(active), 1)
  low = (knobs.fallback_alpha > 0) & (mean < knobs.fallback_alpha)
  # idle < interval * 2**m, written as a shift of idle so that a large probe_interval cannot overflow.
  due = active & ((state.idle >> jnp.minimum(state.probes, MAX_BACKOFF)) >= knobs.probe_interval)
  resting = active & low & ~jnp.any(due)
  return jnp.where(active & ~resting, scheduled, 0).astype(jnp.int32), resting


def update(state: ScheduleState, gamma: int, drafted: jax.Array, accepted: jax.Array, beta: jax.Array,
           resting: jax.Array, active: jax.Array) -> ScheduleState:
  """The history after an iteration: drafted, accepted [B] int32 (k, 0 for finished rows, and n <= k), beta
  [B, G] per drafted position, resting [B] (from `limits`). Rows that drafted nothing keep estimate and length."""
  verified = jnp.minimum(accepted + 1, drafted)  # [B] positions judged: up to and including the first rejection
  decay = jnp.float32(ALPHA_DECAY) ** verified.astype(jnp.float32)
  judged = jnp.sum(jnp.where(jnp.arange(gamma)[None] < verified[:, None], beta, 0.0), axis=1)
  step = jnp.where(accepted == drafted, 2, -1)
  length = jnp.where(active & (drafted > 0), jnp.clip(state.length + step, 1, gamma), state.length)
  # A row that rested last iteration and does not rest now is probing; drafting after a drafting iteration (idle
  # 0) means the last probe brought it back: the backoff starts over.
  probing = active & (state.idle > 0) & ~resting
  probes = jnp.where(probing, state.probes + 1, jnp.where(active & (drafted > 0) & (state.idle == 0), 0,
                                                           state.probes))
  return ScheduleState(beta_sum=state.beta_sum * decay + judged,
                       beta_count=state.beta_count * decay + verified,
                       length=length.astype(jnp.int32),
                       idle=jnp.where(resting, state.idle + 1, 0).astype(jnp.int32),
                       probes=probes.astype(jnp.int32))
