"""A request alone that has verified nothing: whether one drafting step, which shows its acceptance, pays (issue 39).

    recent = engine.acceptance.recent     # [(a_r [G], tokens_r)]: the last served requests that drafted
    if choice.k == 0 and drafts_first(recent, choice.other, ks, costs, theta, iterations, given=3, left=60):
      choice = choice.other               # draft this step; its verdicts decide the next ones

The budget scores a new request at the served requests' pooled acceptance (AcceptancePrior): a mean. Where requests
differ widely that mean is the wrong question for a request that has verified nothing, because a plain step shows
nothing of it: once plain, it stays plain (but for a probe), and so does every request after it, since a request
that never drafted leaves the pool as it was. On the embedded pair's translations the served requests' own a(0)
runs from about 0.3 to 1.0 and the longest (63 tokens, the repeating outputs) are the best drafted: at c=1 the
budget charged from warm-up's curves on a fake clock (docs/bench/serving/model_clock.py, no timing noise) decoded
plain at 460 of 765 steps, the 63-token requests among them at 16 plain steps each where gamma 4 takes 4, after one
early request whose four iterations accepted nothing took the pool's a(0) to 0.47, and served 0.895 of the fixed
gamma 4's tokens per second (twenty-fourth session, docs/serving.md).

So for a request alone (one active row: the step is its own) whose choice is plain and which has verified nothing,
this compares, over the last served requests that drafted (r: their final estimates a_r and their lengths L_r, those
longer than the tokens g this one gave already, a request that gave g tokens being one of them), the seconds of the
rest of the request two ways, in the curves' costs c_k (k: a draft length, 0 plain):
  - plain to its end: R_r / rate_0, R_r = min(L_r - g, left) the tokens it has left, rate_k = I e_r(k) / c_k the
    tokens per second of tier k at r's acceptance (e_r(k): its expected tokens an iteration, `per_row_rate`);
  - one step of the choice's best drafting tier k (its cost as the choice weighed it: the draft's wake, a share of
    iterations), then the rest at r's best tier: c'_k + (R_r - min(I e_r(k), R_r)) / max_j rate_j;
and drafts when the second sum is the smaller (by Budget.stick after a plain step over the same row, as `choose`
weighs a switch). The first step runs at this row's limit (`other.limits`, from its estimates now) and at r's
acceptance; the rest is charged at the curves' costs alone, as if r's acceptance were known after that step (no
margin, no chance of ending early, no settle): an idealisation that leans a little toward drafting. A request that
ignores EOS has a known length: R_r = left for every r. Where requests are alike, their a_r sit at the pool's mean
and the second way loses to plain nearly where the budget's own choice does (a step at a tier worse than plain,
then about the same rest): it explores about as far as the served requests spread. Where they differ, the lengths
weigh in as well: after 20 tokens given plain, only the requests longer than 20 still count, and on the embedded
pair those are the long, well drafted ones.

Exact: the choice comes from the verdicts of requests already served, before the target scores this step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxspec.serving.budget import Choice, per_row_rate, survival, tier_limits


def drafts_first(recent: Sequence[tuple[np.ndarray, int]], other: Choice | None, tiers: Sequence[int],
                 costs: Sequence[float], theta: float, iterations: int, given: int, left: int,
                 known_length: bool = False, tree: Sequence[bool] | None = None, stick: float = 0.0) -> bool:
  """Whether a request alone that verified nothing should run `other` (the plain choice's best drafting tier,
  `Choice.other`) this step (the module docstring). recent: (a_r [G], tokens_r) of the last served requests that
  drafted; tiers: increasing draft lengths (0 first: plain); costs: c(R, k) per tier (their running maximum is
  taken, as `choose` does); iterations: the step's loop iterations; given: the tokens this request gave; left: the
  tokens it may still give; known_length: it ignores EOS (it runs to max_tokens); tree: per tier whether it is a
  tree; stick: after a plain step over the same row, drafting must take less than 1 / (1 + stick) of plain's time
  (Budget.stick, as `choose` weighs a switch). False without a drafting tier or without a served request
  consistent with it."""
  if other is None or other.k == 0 or not recent or left <= 0 or tiers[0] != 0:
    return False
  rows = [(a, n) for a, n in recent if known_length or n > given]
  if not rows:
    return False
  alpha = np.stack([np.asarray(a, np.float64) for a, _ in rows])  # [N, G]
  remaining = np.asarray([left if known_length else min(n - given, left) for _, n in rows], np.float64)  # [N]
  trees = [False] * len(tiers) if tree is None else list(tree)
  surv = survival(alpha)
  per_iteration = np.stack([per_row_rate(surv, tier_limits(alpha, k, theta, tree=t))
                            for k, t in zip(tiers, trees)])  # [T, N]
  rates = iterations * per_iteration / np.maximum.accumulate(np.asarray(costs, np.float64))[:, None]
  # This step runs with this row's limit (from its estimates now: the pool's; a tree's, its nodes), at each served
  # request's acceptance.
  limit = np.full((len(rows),), int(other.limits[0]), np.int32)
  first = np.minimum(iterations * per_row_rate(surv, limit), remaining)
  drafted = other.cost + (remaining - first) / rates.max(axis=0)
  return (1.0 + stick) * float(drafted.sum()) < float((remaining / rates[0]).sum())
