"""A request's acceptance by its age: what the verification budget predicts a row's next drafts from (issue 39).

    curve = AgeCurve.start(gamma=4)
    curve.observe(given, drafted, accepted, limits)  # each step: [A] tokens given before it, drafted, accepted
    own = own_ages(own, given, drafted, iterations)  # [A, AGES] each row's verdicts by the age they were taken at
    alpha = predicted(beta_sum, count, prior, own, prior_ages, given, curve)   # [A, G] what `choose` weighs

A row's estimates (decoding/device/estimates.py) are its own verdicts, decayed, over the prior its insert gave it.
Both were taken at some age of a request, and a request's acceptance moves with its age: on the embedded pair's
translations (the fixed gamma 4 at concurrency 16, docs/bench/serving/acceptance_by_age.log) a row accepted 0.41
of its drafted tokens in its first step, 0.71 in its second, 0.89 and 0.93 in the next two. The budget learnt a
row's hard first step, and the prior it relaxes toward was pooled from the same first steps, so at 16 rows it
decoded plain after each request's first step, where the fixed gamma 4 served 1.08x plain (twenty-eighth session,
docs/serving.md).

So the served steps' verdicts are pooled by the age they were taken at (`AgeCurve`: decayed counts of accepted
and drafted tokens per age bucket, the tokens the request had given before the step: `bucket`), and a row's
estimates are carried from the ages its verdicts were taken at to its age now (`predicted`): each part, its own
verdicts and its prior's, times the ratio a(now) / a(then) of the pool's acceptance at the two ages, a(r) the
per-position acceptance that accepts a share r of gamma drafted tokens in a chain (`alpha_of`: r = (a + a^2 +
... + a^G) / G). A row that drafted l < G tokens an iteration (its limit) counts as a G-chain at the acceptance its
own share gives at l (`observe`'s limits): a short chain accepts a larger share at the same acceptance, and the
young rows, whose estimates are low, draft the shortest. An age bucket with few verdicts sits near UNSEEN (share
1, START drafted tokens' weight): an age no drafting step has reached is taken at its best, so the budget drafts
there and learns it. Before any verdict every ratio is 1: the estimates as the device keeps them.

The pool's acceptance by age is the served workload's, and a row's own verdicts stay its own: a row that accepts
more than the pool at its age keeps that margin, carried along the pool's curve.

Exact: the prediction comes from verdicts of earlier steps only (schedules.py's argument).

Shapes: A active rows, G draft positions, AGES = len(EDGES) + 1 age buckets.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxspec.decoding.device.estimates import DECAY as VERDICT_DECAY, observed

EDGES = (8, 16, 32, 64, 128)  # the tokens a request gave before a step: bucket i holds [EDGES[i - 1], EDGES[i])
AGES = len(EDGES) + 1
DECAY = 0.9  # per step that verified drafts at an age bucket: its older verdicts' weight there
START = 16.0  # an age bucket's prior weight, in drafted tokens, at the share UNSEEN
UNSEEN = 1.0  # the accepted share an age bucket no drafting step has reached starts at (optimism: it is tried)
# Per drafting step of a row its earlier verdicts' ages weigh VERDICT_DECAY (its estimates' 0.9 a verification)
# to the power of the step's iterations: its first position is verified at every one (`own_ages`).
REQUEST_DECAY = 0.9  # per finished request that drafted: the older requests' weight in the prior's ages (as
# budget.AcceptancePrior's)
_GRID = np.linspace(0.0, 1.0, 1001)
_ONEHOT = np.eye(AGES)  # [AGES, AGES]: an age bucket's one-hot row (`own_ages`)
_ONEHOT.flags.writeable = False
_EDGES = np.asarray(EDGES)


def chain_share(alpha: np.ndarray | float, gamma: int) -> np.ndarray:
  """The share of gamma drafted tokens a chain accepts at a per-position acceptance alpha: (a + ... + a^G) / G."""
  a = np.asarray(alpha, np.float64)[..., None]
  return np.mean(a ** np.arange(1, gamma + 1), axis=-1)


@functools.cache
def _grid_shares(gamma: int) -> np.ndarray:
  """[len(_GRID)] chain_share over _GRID for a chain of gamma (read-only): `chain_share`'s inverse interpolates in
  it, once per gamma (a plan inverts it three times: 0.5 ms of the 1 ms a plan took at c=1 rebuilt it each time)."""
  shares = chain_share(_GRID, gamma)
  shares.flags.writeable = False
  return shares


def bucket(given: np.ndarray) -> np.ndarray:
  """[A] int: each row's age bucket from the tokens its request gave before the step (`EDGES`)."""
  return np.searchsorted(_EDGES, np.asarray(given), side="right")


@dataclasses.dataclass
class AgeCurve:
  """The served steps' accepted and drafted tokens by the age bucket they were taken at (decayed counts), and the
  age mix of the finished requests' verdicts (what a new request's prior, budget.AcceptancePrior, is pooled from).
  """

  gamma: int
  accepted: np.ndarray  # [AGES] float64
  drafted: np.ndarray  # [AGES] float64
  prior_ages: np.ndarray  # [AGES] float64: the finished requests' verdicts by age, each request's summing to 1

  @classmethod
  def start(cls, gamma: int) -> "AgeCurve":
    return cls(gamma=max(int(gamma), 1), accepted=np.zeros((AGES,)), drafted=np.zeros((AGES,)),
               prior_ages=np.zeros((AGES,)))

  def observe(self, given: np.ndarray, drafted: np.ndarray, accepted: np.ndarray,
              limits: np.ndarray | None = None) -> None:
    """One step's verdicts: per row that drafted, the tokens its request gave before the step, the tokens it
    drafted and those accepted, and its draft limit (None: gamma) ([A] each). A row whose limit is below gamma
    counts the accepted tokens a gamma-chain would at the acceptance its share gives at its limit. Rows that
    drafted nothing are left out."""
    drafted = np.asarray(drafted, np.float64)
    took = drafted > 0
    if not took.any():
      return
    accepted = np.asarray(accepted, np.float64)[took]
    if limits is not None:  # (np.minimum and np.maximum, not np.clip: 3x the time on a step's few rows)
      limit = np.minimum(np.maximum(np.asarray(limits)[took], 1), self.gamma)
      short = limit < self.gamma
      if short.any():
        share = np.minimum(np.maximum(accepted / drafted[took], 0.0), 1.0)
        for l in np.unique(limit[short]).tolist():
          rows = short & (limit == l)
          alpha = np.interp(share[rows], _grid_shares(int(l)), _GRID)
          accepted[rows] = chain_share(alpha, self.gamma) * drafted[took][rows]
    ages = bucket(np.asarray(given)[took])
    d = np.bincount(ages, drafted[took], AGES)
    a = np.bincount(ages, accepted, AGES)
    seen = d > 0
    self.drafted = np.where(seen, DECAY * self.drafted + d, self.drafted)
    self.accepted = np.where(seen, DECAY * self.accepted + a, self.accepted)

  def finish(self, own: np.ndarray) -> None:
    """A request ended: its verdicts' ages (`own_ages`' row, [AGES]) join the prior's age mix; none: no change."""
    total = float(np.sum(own))
    if total > 0:
      self.prior_ages = REQUEST_DECAY * self.prior_ages + np.asarray(own, np.float64) / total

  @property
  def shares(self) -> np.ndarray:
    """[AGES] the accepted share of drafted tokens by age (as a gamma-chain's), from UNSEEN at START tokens'
    weight."""
    return (self.accepted + START * UNSEEN) / (self.drafted + START)

  def alpha_of(self, share: np.ndarray) -> np.ndarray:
    """The per-position acceptance a whose chain of gamma accepts `share` of its drafts (`chain_share`'s
    inverse)."""
    return np.interp(share, _grid_shares(self.gamma), _GRID)


def own_ages(own: np.ndarray, given: np.ndarray, drafted: np.ndarray, iterations: np.ndarray) -> np.ndarray:
  """[A, AGES] rows' verdicts by age after a step: own [A, AGES] before it, times VERDICT_DECAY^iterations where
  the row drafted (iterations [A]: the step's iterations it ran), plus the tokens it drafted at its age bucket
  (`given` [A] the tokens given before the step)."""
  drafted = np.asarray(drafted, np.float64)
  took = drafted > 0
  onehot = _ONEHOT[bucket(given)] * drafted[:, None]
  keep = (VERDICT_DECAY ** np.asarray(iterations, np.float64))[:, None]
  return np.where(took[:, None], keep * np.asarray(own, np.float64) + onehot, own)


def predicted(beta_sum: np.ndarray, count: np.ndarray, prior: np.ndarray, own: np.ndarray, prior_ages: np.ndarray,
              given: np.ndarray, curve: AgeCurve) -> np.ndarray:
  """[A, G] each row's acceptance estimates carried to its age now: beta_sum, count, prior [A, G] its estimates
  (the host's copy) and its insert's prior; own [A, AGES] its verdicts' ages (`own_ages`), prior_ages [A, AGES]
  the age mix of its prior (the curve's at its insert); given [A] the tokens it gave. Each part, the verdicts and
  the prior's mass, is scaled by a(now) / a(its ages), a = `AgeCurve.alpha_of` the pool's share at an age (a part
  whose ages are unknown is taken at the row's age now: ratio 1)."""
  beta_sum, count = np.asarray(beta_sum, np.float64), np.asarray(count, np.float64)
  prior = np.asarray(prior, np.float64)
  seen_sum, seen = observed(beta_sum, count, prior)
  seen = np.minimum(np.maximum(seen, 0.0), count)  # np.clip: 3x the time on a plan's few rows
  seen_sum = np.minimum(np.maximum(seen_sum, 0.0), seen)
  shares = curve.shares
  parts = np.stack([np.asarray(prior_ages, np.float64), np.asarray(own, np.float64)])  # [2, A, AGES]
  total = parts.sum(axis=-1)  # [2, A]
  # The pool's share at each row's age now and at its two parts' ages, inverted together (one np.interp a plan)
  pooled = np.concatenate([shares[bucket(given)][None], (parts @ shares) / np.maximum(total, 1e-9)])  # [3, A]
  now, *then = curve.alpha_of(pooled)
  ratio = np.where(total > 0, now / np.maximum(then, 1e-3), 1.0)[..., None]  # [2, A, 1]
  alpha = ((count - seen) * prior * ratio[0] + seen_sum * ratio[1]) / np.maximum(count, 1e-6)
  return np.minimum(np.maximum(alpha, 0.0), 1.0)
