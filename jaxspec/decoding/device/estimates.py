"""Per-row, per-draft-position acceptance estimates, kept on the device and updated by every verification: what
the slot engine's verification budget (jaxspec/serving/budget.py) chooses draft lengths from.

    est = Estimates.prior(rows, positions)             # every row at the prior (a request's insert)
    est = est.update(active, drafted, accepted, beta)  # inside the loop's `iteration`, after verification
    est.alpha                                          # [B, G] a(b, j): P(draft j + 1 accepted | the j before were)

Position j of row b holds a decayed sum of beta (sum_x min(p, q) per verified position: 1 / 0 at temperature 0,
as `verify.Acceptance.beta`) and a decayed count of the iterations that verified it (drafted it and accepted the
positions before it, so that position j is judged: j < min(accepted + 1, drafted), as `DecodeStats` counts
verified positions); alpha = sum / count. So a(b, j) estimates the conditional acceptance of the row's (j + 1)-th
draft token, and the survival s(b, k) = a(b, 0) ... a(b, k - 1) the probability that its k-th draft is accepted.

A position an active row did not verify in an iteration (it drafted fewer tokens, a rejection came first, or it
rested) relaxes toward the prior (RELAX per iteration): a row whose estimates told the budget not to draft comes
back to drafting after a while and is measured again (vLLM's and this loop's fallback probes, in one rule), so no
row is shut out for good by a bad start. Rows that are done (frozen) keep their estimates.

Exactness: the estimates are read by the host between steps to choose the next step's draft lengths, which are
fixed before the target scores the tokens they verify: a choice from past verdicts only (schedules.py's argument).

Shapes: B rows, G positions (the engine's largest draft length).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

PRIOR_ALPHA = 0.8  # a fresh row's a(b, j) at every position: new requests draft (the budget's cost curves permitting)
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

  @classmethod
  def prior(cls, batch: int, positions: int) -> "Estimates":
    count = jnp.full((batch, positions), PRIOR_COUNT, jnp.float32)
    return cls(beta_sum=count * PRIOR_ALPHA, count=count)

  @property
  def alpha(self) -> jax.Array:
    """[B, G] the running acceptance estimate per position, in [0, 1]."""
    return jnp.clip(self.beta_sum / jnp.maximum(self.count, 1e-6), 0.0, 1.0)

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
    prior_sum, prior_count = PRIOR_COUNT * PRIOR_ALPHA, PRIOR_COUNT
    beta_sum = jnp.where(verified, DECAY * self.beta_sum + beta,
                         jnp.where(relaxed, RELAX * self.beta_sum + (1 - RELAX) * prior_sum, self.beta_sum))
    count = jnp.where(verified, DECAY * self.count + 1.0,
                      jnp.where(relaxed, RELAX * self.count + (1 - RELAX) * prior_count, self.count))
    return Estimates(beta_sum=beta_sum.astype(jnp.float32), count=count.astype(jnp.float32))

