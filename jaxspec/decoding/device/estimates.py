"""Per-row, per-draft-position acceptance estimates, kept on the device and updated by every verification: what
the slot engine's verification budget (jaxspec/serving/budget.py) chooses draft lengths from.

    est = Estimates.prior_at(rows, positions, alpha)   # every row at its prior (a request's insert)
    est = est.update(active, drafted, accepted, beta)  # inside the loop's `iteration`, after verification
    est.alpha                                          # [B, G] a(b, j): P(draft j + 1 accepted | the j before were)

Position j of row b holds a decayed sum of beta (sum_x min(p, q) per verified position: 1 / 0 at temperature 0,
as `verify.Acceptance.beta`) and a decayed count of the iterations that verified it (drafted it and accepted the
positions before it, so that position j is judged: j < min(accepted + 1, drafted), as `DecodeStats` counts
verified positions); alpha = sum / count. So a(b, j) estimates the conditional acceptance of the row's (j + 1)-th
draft token, and the survival s(b, k) = a(b, 0) ... a(b, k - 1) the probability that its k-th draft is accepted.

A fresh row starts at the prior its insert gives (the slot engine's: the served requests' acceptance,
serving/budget.AcceptancePrior; PRIOR_ALPHA before any), at the weight of PRIOR_COUNT verifications. A position an
active row did not verify in an iteration (it drafted fewer tokens, a rejection came first, or it rested) relaxes
toward that prior (RELAX per iteration): a row whose estimates told the budget not to draft comes back to drafting
after a while and is measured again (vLLM's and this loop's fallback probes, in one rule), so no row is shut out
for good by a bad start.
Rows that are done (frozen) keep their estimates. A step that drafts nothing verifies nothing, so its n
iterations only relax every position: `relaxed` applies them at once (the slot engine's plain steps leave the
estimates out of their program and the next drafting step catches up).

Exactness: the estimates are read by the host between steps to choose the next step's draft lengths, which are
fixed before the target scores the tokens they verify: a choice from past verdicts only (schedules.py's argument).

Shapes: B rows, G positions (the engine's largest draft length).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

PRIOR_ALPHA = 0.8  # a fresh row's a(b, j) before any request was served (the slot engine's prior then)
# The prior's weight, in verified positions. At 2 one early rejection took a fresh row's a(b, 1) from 0.8 to 0.51
# and two to 0.35, so the verification budget sent rows of ordinary acceptance to plain decoding, where nothing is
# verified and they stayed: replayed on the embedded pair's served workload (its exact per-position draft matches,
# docs/bench/serving/replay.py), 8 gave 1.00x the fixed gamma 4 at concurrency 1 where 2 gave 0.97x.
PRIOR_COUNT = 8.0
DECAY = 0.9  # per verification of a position: the older verdicts' weight (about the last ten count)
RELAX = 0.98  # per iteration in which an active row leaves a position unverified: its weight toward the prior


@struct.dataclass
class Estimates:
  """Decayed sums of beta and counts of verifications per row and draft position."""

  beta_sum: jax.Array  # [B, G] float32
  count: jax.Array  # [B, G] float32
  prior: jax.Array  # [B, G] float32: the row's prior a(b, j), where its unverified positions relax

  @classmethod
  def prior_at(cls, batch: int, positions: int, alpha: jax.Array | float = PRIOR_ALPHA) -> "Estimates":
    """Every row at its prior a(b, j) = alpha (a number, or [B or 1, G]: the slot engine's served requests'
    acceptance, serving/budget.AcceptancePrior) at the weight of PRIOR_COUNT verifications."""
    count = jnp.full((batch, positions), PRIOR_COUNT, jnp.float32)
    prior = jnp.broadcast_to(jnp.asarray(alpha, jnp.float32), (batch, positions))
    return cls(beta_sum=count * prior, count=count, prior=prior)

  @property
  def alpha(self) -> jax.Array:
    """[B, G] the running acceptance estimate per position, in [0, 1]."""
    return jnp.clip(self.beta_sum / jnp.maximum(self.count, 1e-6), 0.0, 1.0)

  def relaxed(self, iterations: jax.Array) -> "Estimates":
    """The estimates after `iterations` ([B] int32 >= 0) iterations of each row that verified no position (a
    plain step's), at once: `relaxed` below. A plain step of the slot engine leaves the estimates out of its
    program and the next step that keeps them brings them up to date here (slots.py: SlotState.est_at)."""
    beta_sum, count = relaxed(self.beta_sum, self.count, self.prior, iterations)
    return Estimates(beta_sum=beta_sum, count=count, prior=self.prior)

  def update(self, active: jax.Array, drafted: jax.Array, accepted: jax.Array, beta: jax.Array) -> "Estimates":
    """After one iteration: active [B] bool (the rows that decoded it), drafted (k) and accepted (n <= k) [B]
    int32, beta [B, g] float32 per drafted position (g <= G: the iteration's draft length; positions >= g were
    not drafted)."""
    positions = self.beta_sum.shape[1]
    g = beta.shape[1]
    beta = jnp.pad(beta, ((0, 0), (0, positions - g))) if g < positions else beta[:, :positions]
    j = jnp.arange(positions)[None]
    verified = active[:, None] & (j < jnp.minimum(accepted + 1, drafted)[:, None])
    relaxed = active[:, None] & ~verified
    prior_sum, prior_count = PRIOR_COUNT * self.prior, PRIOR_COUNT
    beta_sum = jnp.where(verified, DECAY * self.beta_sum + beta,
                         jnp.where(relaxed, RELAX * self.beta_sum + (1 - RELAX) * prior_sum, self.beta_sum))
    count = jnp.where(verified, DECAY * self.count + 1.0,
                      jnp.where(relaxed, RELAX * self.count + (1 - RELAX) * prior_count, self.count))
    return Estimates(beta_sum=beta_sum.astype(jnp.float32), count=count.astype(jnp.float32), prior=self.prior)


def observed(beta_sum, count, prior):
  """(sum, count) [..., G] of the verdicts alone in estimates (beta_sum, count [..., G]) that started at `prior`
  [..., G] and relax toward it (numpy or jax arrays): the prior's share taken out. Exact: the prior's mass m
  (PRIOR_COUNT at the start, DECAY times itself a verification, RELAX times itself plus (1 - RELAX) PRIOR_COUNT a
  relaxation) and the verdicts' count o (DECAY o + 1, RELAX o) keep m / PRIOR_COUNT + (1 - DECAY) o = 1, so
  count = m + o gives o = (count - PRIOR_COUNT) / (1 - PRIOR_COUNT (1 - DECAY)) and the verdicts' sum is
  beta_sum - m prior. What a finished request tells of the served requests' acceptance (budget.AcceptancePrior)."""
  seen = (count - PRIOR_COUNT) / (1.0 - PRIOR_COUNT * (1.0 - DECAY))
  return beta_sum - (count - seen) * prior, seen


def relaxed(beta_sum, count, prior, iterations):
  """(sum, count) [B, G] of estimates (beta_sum, count, prior [B, G]; numpy or jax arrays) after `iterations` ([B]
  int >= 0) iterations in which each row verified no position (it drafted nothing: every position relaxes), in
  closed form: n relaxations take the sum s to RELAX^n s + (1 - RELAX^n) PRIOR_COUNT prior and the count c to
  RELAX^n c + (1 - RELAX^n) PRIOR_COUNT, as n calls of `Estimates.update` do (up to rounding), and keep `observed`'s
  invariant. float32, as the device's."""
  keep = (RELAX ** (iterations * 1.0))[:, None]
  dtype = getattr(beta_sum, "dtype", None)
  new_sum = keep * beta_sum + (1 - keep) * PRIOR_COUNT * prior
  new_count = keep * count + (1 - keep) * PRIOR_COUNT
  return new_sum.astype(dtype), new_count.astype(dtype)
