"""The verification budget (jaxspec/serving/budget.py, decoding/device/estimates.py), the slot engine's default
speculation with a drafter and no table: its choice alone (numbers whose answer is known), the device's estimates
against a numpy recomputation, and engines on tiny in-process models: forced cost curves that make plain decoding
cheapest run plain everywhere; a draft equal to the target (alpha 1) moves to the widest tier; greedy output under
the budget equals plain `generate` for a draft model, a feature head, prompt lookup and a tree; the host's
estimates after steps equal a numpy recomputation from the steps' drafted / accepted counts; warmup measures
every (rows, tier) cost and compiles every program (tiers x modes x row buckets), and nothing recompiles after."""

from __future__ import annotations

import base64
import collections
import dataclasses
import pickle
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import distributed

import jaxspec
from jaxspec.decoding.device import estimates as est
from jaxspec.errors import SettingsError
from jaxspec.serving import RequestSettings, SlotEngine, SpeculationTable, TableEntry, ages, hosts
from jaxspec.serving import engine as engine_module
from jaxspec.serving.budget import (SIDE, TIER, AcceptancePrior, Ahead, Budget, Choice, CostCurves, EndRate, choose,
                                    curves_from_rounds, expected_tokens, row_limits, survival, within,
                                    within_lengths)
from jaxspec.serving.probes import Run, SideRuns
from jaxspec.serving.budget import from_flags as budget_flags

from engine_helpers import Request, cost_curves, drive, generate_tokens
from test_slot_engine_drafters import PROMPTS, _case, _llama

# The choice is E / c alone, from the costs a test sets (the margin, the learning and the empty slots: own tests).
AS_SET = Budget(margin=0.0, learn=0.0, idle=0.0, stick=0.0, repeats=1, probe=0.0)  # warm-up curves: set by tests

MAX_NEW = 14


def _np_update(beta_sum, count, active, drafted, accepted, beta, prior=est.PRIOR_ALPHA):
  """numpy's reading of estimates.Estimates.update (the module docstring's rule), for one iteration; prior: the
  rows' priors (a number or [B, G]), where unverified positions relax."""
  j = np.arange(beta_sum.shape[1])[None]
  beta = np.pad(beta, ((0, 0), (0, beta_sum.shape[1] - beta.shape[1])))
  verified = active[:, None] & (j < np.minimum(accepted + 1, drafted)[:, None])
  relaxed = active[:, None] & ~verified
  prior_sum, prior_count = est.PRIOR_COUNT * np.asarray(prior), est.PRIOR_COUNT
  new_sum = np.where(verified, est.DECAY * beta_sum + beta,
                     np.where(relaxed, est.RELAX * beta_sum + (1 - est.RELAX) * prior_sum, beta_sum))
  new_count = np.where(verified, est.DECAY * count + 1,
                       np.where(relaxed, est.RELAX * count + (1 - est.RELAX) * prior_count, count))
  return new_sum, new_count


# -- the choice alone ------------------------------------------------------------------------------------------

def test_limits_and_expected_tokens():
  alpha = np.array([[1.0, 0.5, 0.5, 1.0], [0.1, 1.0, 1.0, 1.0], [0.9, 0.9, 0.9, 0.9]])
  surv = survival(alpha)
  np.testing.assert_allclose(surv[0], [1.0, 0.5, 0.25, 0.25])
  assert row_limits(surv, 4, 0.3).tolist() == [2, 0, 4]
  assert row_limits(surv, 2, 0.3).tolist() == [2, 0, 2]
  assert row_limits(surv, 0, 0.3).tolist() == [0, 0, 0]
  assert expected_tokens(surv, np.array([2, 0, 1])) == pytest.approx(3 + 1.0 + 0.5 + 0.9)


def test_choose_follows_the_costs():
  good, bad = np.full((4, 4), 0.95), np.full((4, 4), 0.05)
  tiers = (0, 1, 2, 4)
  flat = [1.0, 1.01, 1.02, 1.04]
  assert choose(good, tiers, flat, 0.2).k == 4  # drafting is nearly free and accepted: the widest tier
  assert choose(good, tiers, [1.0, 3.0, 5.0, 9.0], 0.2).k == 0  # drafting costs more than it gains: plain
  bad_choice = choose(bad, tiers, flat, 0.2)
  assert bad_choice.k == 0 and bad_choice.limits.tolist() == [0, 0, 0, 0]  # nobody's survival reaches theta
  mixed = choose(np.concatenate([good[:2], bad[:2]]), tiers, flat, 0.2)
  assert mixed.k == 4 and mixed.limits.tolist() == [4, 4, 0, 0]  # per-row limits inside the tier
  # A wider tier timed below a narrower one (noise) costs as much as the narrower: drafts that are never accepted
  # then gain nothing, and the tie goes to plain.
  assert choose(np.zeros((4, 4)), tiers, [1.0, 0.5, 0.5, 0.5], 0.0).k == 0
  tree = choose(good, (0, 3), [1.0, 1.5], 0.2, tree=[False, True])
  assert tree.k == 3 and tree.limits.tolist() == [3] * 4


def test_a_row_near_its_end_is_charged_for_the_iterations_it_cannot_use():
  # alpha 0.9: a chain tier of 4 expects 1 + .9 + .81 + .73 + .66 = 4.1 tokens an iteration, plain 1; the tier
  # costs 2.5 plain steps. Rows far from their end draft. Three rows with 3 tokens left beside one far from its
  # end: the step runs its 4 iterations either way, the three give their 3 tokens in a plain step as in a drafting
  # one, and the cheaper plain step wins (13 tokens at 1 against 25.4 at 2.5; without the cap: 4 + 3 x 16.4).
  alpha, tiers, costs = np.full((4, 4), 0.9), (0, 4), [1.0, 2.5]
  assert choose(alpha, tiers, costs, 0.2).k == 4
  assert choose(alpha, tiers, costs, 0.2, left=np.full((4,), 64), iterations=4).k == 4
  near = choose(alpha, tiers, costs, 0.2, left=np.array([3, 3, 3, 64]), iterations=4)
  assert near.k == 0 and near.expected == pytest.approx(13.0)
  assert expected_tokens(survival(alpha), np.full((4,), 4), np.array([3, 64, 64, 64]), 4) == pytest.approx(
      3 + 3 * 4 * (1 + .9 + .81 + .729 + .6561))
  # When every row ends within the step the loop stops early: a drafting step that ends them all in one iteration
  # costs a quarter of its 4 (2.5 / 4 against plain's 3 iterations of 4: 12 tokens at 0.625 against 12 at 0.75).
  ending = choose(alpha, tiers, costs, 0.2, left=np.full((4,), 3), iterations=4)
  assert ending.k == 4 and ending.cost == pytest.approx(0.625)


def test_rows_that_end_early_weigh_against_the_widest_tier():
  # A row expected to end (EOS) after any token with chance h gives (1 - (1 - h)^T) / h of T tokens: with h = 0.1,
  # 3.44 of 4 (plain's step of 4 iterations) and 8.22 of 16.4 (a tier of 4 at alpha 0.9): its rate drops 1.99x
  # against plain's 1.16x. Four such rows keep the loop running 0.90 of the tier's iterations (1.00 of plain's),
  # so at 2.8 plain steps the tier wins for rows that never end early (65.5 / 2.8 against 16) and loses for these
  # (32.9 / (2.8 x 0.90) = 13.1 against 13.8).
  assert within(np.array([4.0, 16.0]), np.array([0.1, 0.0])) == pytest.approx([(1 - 0.9 ** 4) / 0.1, 16.0])
  assert within(np.array([4.0]), None) == pytest.approx([4.0])
  alpha, tiers, costs, left = np.full((4, 4), 0.9), (0, 4), [1.0, 2.8], np.full((4,), 64)
  assert choose(alpha, tiers, costs, 0.2, left=left, iterations=4, hazard=np.zeros((4,))).k == 4
  ending = choose(alpha, tiers, costs, 0.2, left=left, iterations=4, hazard=np.full((4,), 0.1))
  assert ending.k == 0 and ending.expected == pytest.approx(4 * (1 - 0.9 ** 4) / 0.1)
  # Rows that ignore EOS (rate 0) beside them: the tier wins again for its 3 far rows' 16.4 each.
  assert choose(alpha, tiers, costs, 0.2, left=left, iterations=4, hazard=np.array([0.1, 0.0, 0.0, 0.0])).k == 4


def test_a_request_alone_that_ends_early_ends_the_step_too():
  # One row alone: the loop stops when it ends, so an early end costs its tokens and the iterations it would have
  # run. Its chance of decoding at iteration i is 0.9^(e i): 0.86 of plain's 4 iterations are expected to run
  # and 0.585 of the tier's, so the tier (8.22 / (2.8 x 0.585) = 5.0) beats plain (3.44 / 0.86 = 4.0), where
  # beside three more such rows (above) it lost.
  alpha, tiers, costs = np.full((1, 4), 0.9), (0, 4), [1.0, 2.8]
  alone = choose(alpha, tiers, costs, 0.2, left=np.array([64]), iterations=4, hazard=np.array([0.1]))
  assert alone.k == 4 and alone.cost == pytest.approx(2.8 * np.mean(0.9 ** (4.0951 * np.arange(4))), rel=1e-3)
  plain = choose(alpha, tiers, [1.0, 99.0], 0.2, left=np.array([64]), iterations=4, hazard=np.array([0.1]))
  assert plain.k == 0 and plain.cost == pytest.approx(np.mean(0.9 ** np.arange(4)))
  # Without a hazard only max_tokens ends it: every iteration runs while it has tokens left.
  assert choose(alpha, tiers, [1.0, 99.0], 0.2, left=np.array([64]), iterations=4).cost == pytest.approx(1.0)


def test_a_slot_left_empty_through_the_next_step_weighs_against_long_steps():
  # With no request waiting, a row that ends in a step leaves its slot empty through the next one (the next request
  # arrives during it): its tokens count 1 / (1 + p), p its chance of ending in the step. h = 0.05, alpha 0.9:
  # plain gives 3.71 tokens of 4 (p 0.19: 3.13), the tier of 4 11.37 of 16.4 (p 0.57: 7.25). At 2.5 plain steps
  # the tier wins when a request waits (4.55 against 3.71 a plain step's cost) and loses when none does (2.90
  # against 3.13).
  alpha, tiers, costs, left = np.full((4, 4), 0.9), (0, 4), [1.0, 2.5], np.full((4,), 64)
  hazard = np.full((4,), 0.05)
  assert choose(alpha, tiers, costs, 0.2, left=left, iterations=4, hazard=hazard).k == 4
  empty = choose(alpha, tiers, costs, 0.2, left=left, iterations=4, hazard=hazard, idle=1.0)
  plain = (1 - 0.95 ** 4) / 0.05
  assert empty.k == 0 and empty.expected == pytest.approx(4 * plain / (2 - 0.95 ** 4))
  # A row that surely ends in the step (left <= its tokens) counts half in every tier.
  last = choose(alpha, tiers, costs, 0.2, left=np.full((4,), 3), iterations=4, idle=1.0)
  # Half the next step (the default, Budget.idle): 8.86 a row for the tier, 3.40 for plain: the tier wins.
  half, tier = choose(alpha, tiers, costs, 0.2, left=left, iterations=4, hazard=hazard, idle=0.5), 4 * 4.0951
  assert half.k == 4 and half.expected == pytest.approx(4 * (1 - 0.95 ** tier) / 0.05 / (1 + 0.5 * (1 - 0.95 ** tier)))
  assert last.expected == pytest.approx(4 * 3 / 2)


def test_the_engine_counts_slots_left_empty_only_when_none_waits(engine, monkeypatch):
  seen = []
  real = engine_module.choose
  monkeypatch.setattr(engine_module, "choose", lambda *a, **kw: seen.append(kw["idle"]) or real(*a, **kw))
  monkeypatch.setattr(engine, "budget", Budget(margin=0.0, learn=0.0, idle=0.5, hold=0))
  slots = []
  for p in PROMPTS[:2]:
    slots.append(engine.free_slots()[0])
    engine.insert(slots[-1], p, RequestSettings(MAX_NEW))
  engine.set_queue(0)
  engine.plan_step()
  engine.set_queue(3)
  engine.plan_step()
  engine.free(slots[0])
  engine.set_queue(0)
  engine.plan_step()  # one row: when it ends the engine stops, and the next request is inserted at once
  assert seen == [0.5, 0.0, 0.0]
  engine.free(slots[1])


def test_the_previous_tier_is_kept_unless_another_is_clearly_better():
  # alpha 0.9, a tier of 4 at 3.5 plain steps: E / c = 4.1 / 3.5 = 1.17 against plain's 1. From plain, a stick of
  # 0.2 keeps plain (1.17 < 1.2); 0.1 moves; from the tier, plain (0.85 of it) never beats it by more.
  alpha, tiers, costs = np.full((4, 4), 0.9), (0, 4), [1.0, 3.5]
  assert choose(alpha, tiers, costs, 0.2).k == 4
  assert choose(alpha, tiers, costs, 0.2, current=0, stick=0.2).k == 0
  assert choose(alpha, tiers, costs, 0.2, current=0, stick=0.1).k == 4
  assert choose(alpha, tiers, costs, 0.2, current=1, stick=0.2).k == 4
  assert choose(alpha, tiers, [1.0, 5.0], 0.2, current=1, stick=0.2).k == 0  # 4.1 / 5 = 0.82: 1 > 1.2 x 0.82
  # Between drafting tiers no stick: at 2.5 and 3.6 plain steps a tier of 2 scores 2.71 / 2.5 = 1.08, one of 4
  # 4.1 / 3.6 = 1.14 (5 % more): from the tier of 2 the tier of 4 runs at once. From plain, the drafting side's
  # best (the tier of 4) must beat plain by the stick.
  tiers, costs = (0, 2, 4), [1.0, 2.5, 3.6]
  assert choose(alpha, tiers, costs, 0.2, current=1, stick=0.1).k == 4
  assert choose(alpha, tiers, costs, 0.2, current=0, stick=0.2).k == 0
  assert choose(alpha, tiers, costs, 0.2, current=0, stick=0.1).k == 4
  # At 2.8 and 4.3 plain steps the tiers score 0.97 and 0.95 and plain 1.0, under the stick's 1.1 x 0.97: from
  # either drafting tier the step drafts, at the drafting side's best (the tier of 2).
  assert choose(alpha, tiers, [1.0, 2.8, 4.3], 0.2, current=1, stick=0.1).k == 2
  assert choose(alpha, tiers, [1.0, 2.8, 4.3], 0.2, current=2, stick=0.1).k == 2
  assert choose(alpha, tiers, [1.0, 2.8, 4.3], 0.2, current=2, stick=0.0).k == 0


def _choose_tier_by_tier(alpha, tiers, costs, theta, tree=None, left=None, iterations=1, margin=0.0, behind=None,
                         catchup=0.0, hazard=None, idle=0.0, current=None, stick=0.0):
  """The module docstring's rule written tier by tier from the row helpers (`choose` scores every tier at once):
  (tier, limits, E, c')."""
  from jaxspec.serving.budget import _per_row, per_row_rate  # pylint: disable=import-outside-toplevel
  surv, costs = survival(alpha), np.maximum.accumulate(np.asarray(costs, np.float64))
  remaining = None if left is None else np.asarray(left, np.float64)
  if remaining is not None and hazard is not None:
    remaining = np.where(hazard > 0, np.minimum(remaining, 1.0 / np.where(hazard > 0, hazard, 1.0)), remaining)
  best = {}
  for i, k in enumerate(tiers):
    limits = np.full((len(surv),), k, np.int32) if tree is not None and tree[i] else row_limits(surv, k, theta)
    if k > 0 and not (tree is not None and tree[i]) and not limits.any():
      continue
    rate = per_row_rate(surv, limits)
    per_row, share = _per_row(rate, left, iterations, hazard, idle)
    cost = costs[i] * share * ((1.0 + margin) if k > 0 else 1.0)
    drafting = limits > 0
    if catchup > 0 and behind is not None and np.any(behind & drafting):
      steps = 1.0 if remaining is None else float(np.median(remaining[drafting] / (iterations * rate[drafting])))
      cost += catchup / max(1.0, steps)
    e, side = float(np.sum(per_row)), k > 0
    if side not in best or e / cost > best[side][2] / best[side][3] * (1 + 1e-9):
      best[side] = (i, limits, e, cost)
  winner = max(best.values(), key=lambda c: (c[2] / c[3], -tiers[c[0]]))
  if current is not None and len(best) == 2:
    kept = best[tiers[current] > 0]
    if winner[2] / winner[3] <= (1 + stick) * kept[2] / kept[3]:
      return kept
  return winner


def test_choose_scores_every_tier_as_the_rule_tier_by_tier():
  rng = np.random.default_rng(0)
  for _ in range(400):
    a = int(rng.integers(1, 9))
    alpha = rng.uniform(0, 1, (a, 4)) ** rng.uniform(0.1, 2)
    tiers, tree = ((0, 1, 2, 4), None) if rng.random() < 0.8 else ((0, 3), [False, bool(rng.random() < 0.5)])
    kw = {}
    if rng.random() < 0.6:
      kw.update(left=rng.integers(1, 40, a), iterations=int(rng.integers(1, 6)))
    if rng.random() < 0.4:
      kw.update(hazard=rng.uniform(0, 0.2, a) * (rng.random(a) < 0.7))
    if rng.random() < 0.3:
      kw.update(idle=float(rng.uniform(0, 1)))
    if rng.random() < 0.4:
      kw.update(behind=rng.random(a) < 0.5, catchup=float(rng.uniform(0, 5)))
    if rng.random() < 0.5:
      kw.update(current=int(rng.integers(0, len(tiers))), stick=float(rng.uniform(0, 0.3)))
    if rng.random() < 0.3:
      kw.update(margin=float(rng.uniform(0, 0.5)))
    costs, theta = rng.uniform(0.5, 5, len(tiers)), float(rng.uniform(0, 0.5))
    got = choose(alpha, tiers, costs, theta, tree=tree, **kw)
    tier, limits, e, cost = _choose_tier_by_tier(alpha, tiers, costs, theta, tree=tree, **kw)
    assert (got.tier, got.k) == (tier, tiers[tier]) and got.limits.tolist() == limits.tolist()
    assert got.expected == pytest.approx(e) and got.cost == pytest.approx(cost)


def test_the_end_rate_counts_early_ends_per_token():
  rate = EndRate()
  assert rate.rate == 0.0  # the prior: 64 tokens, no end
  rate.observe(3, ended=True)  # one short answer does not set it
  assert rate.rate == pytest.approx(1 / (EndRate.PRIOR_TOKENS * EndRate.DECAY + 3))
  for _ in range(400):  # answers of 20 tokens ending by EOS, one in two: about 1 / 40 (the decay weighs the last)
    rate.observe(20, ended=True)
    rate.observe(20, ended=False)
  assert rate.rate == pytest.approx(1 / 40, rel=0.02)


def test_the_end_rate_draws_a_rows_tokens_left_from_the_served_lengths():
  rate = EndRate()
  for _ in range(EndRate.SAMPLES - 1):
    rate.observe(27, ended=True)
  assert rate.remaining(np.asarray([5]), np.asarray([True])) is None  # too few requests: the hazard alone
  rate.observe(64, ended=False)  # one ran to its max_tokens: it did not end early
  values, weights = rate.remaining(np.asarray([5, 30, 5, 70]), np.asarray([True, True, False, True]))
  assert values.shape == weights.shape == (4, EndRate.SAMPLES + 1)
  assert sorted(values[0][weights[0] > 0].tolist()) == [22.0] * (EndRate.SAMPLES - 1) + [np.inf]
  assert values[1][weights[1] > 0].tolist() == [np.inf]  # past the 27-token ones: only the long one counts
  assert values[2][weights[2] > 0].tolist() == [np.inf]  # it ignores EOS
  assert values[3][weights[3] > 0].tolist() == [np.inf]  # longer than every one: no early end, `left` caps it
  # A row 5 tokens into 27-token translations gives all of a 16-token step; one hazard a token said 12.2.
  alone = EndRate()
  for _ in range(EndRate.SAMPLES):
    alone.observe(27, ended=True)
  rows = alone.remaining(np.asarray([5, 25]), np.asarray([True, True]))
  np.testing.assert_allclose(within_lengths(np.asarray([16.0, 16.0]), rows), [16.0, 2.0])
  assert within(np.asarray([16.0]), np.asarray([1 / 27]))[0] == pytest.approx(12.24, abs=0.01)


def test_lengths_by_age_make_it_draft_where_one_hazard_kept_it_plain():
  """16 rows 1-12 tokens into 26-28-token translations at 0.8 a position after plain steps (a catch-up and a settle
  to pay), gamma 4 at 2.6 plain steps (the embedded pair's c=16 on a fast spell): one hazard a token (1/27) takes
  a quarter of the drafting step's tokens and keeps it plain; the served lengths, by which these young rows do not
  end within the step, make it draft (the negative control: the hazard's own choice)."""
  given = np.linspace(1, 12, 16).round().astype(int)
  alpha = np.full((16, 4), 0.8)
  rate = EndRate()
  for n in range(32):
    rate.observe(27 + n % 3 - 1, ended=True)
  costs, left = [0.0509, 0.0900, 0.1071, 0.1323], 64 - given
  kw = dict(left=left, iterations=4, catchup=0.0291, behind=np.ones((16,), bool), settle=0.0048)
  hazard = choose(alpha, [0, 1, 2, 4], costs, 0.2, hazard=np.full((16,), 1 / 27), **kw)
  drawn = choose(alpha, [0, 1, 2, 4], costs, 0.2, remaining=rate.remaining(given, np.ones((16,), bool)), **kw)
  assert hazard.k == 0 and drawn.k == 4
  assert drawn.expected / drawn.cost > 1.1 * drawn.other.expected / drawn.other.cost
  assert drawn.expected > 1.2 * hazard.other.expected  # the young rows' drafts are no longer lost to ends


def test_an_age_curve_carries_a_rows_estimates_to_its_age():
  """ages.py: before any verdict, and on a curve as flat across ages as its verdicts, the prediction is the
  device's estimates; where young rows accept less, a row whose verdicts were taken young is raised as it ages,
  and an age no step has drafted at starts at ages.UNSEEN (tried)."""
  g, prior = 4, np.full((1, 4), 0.8)
  beta_sum, count = est.PRIOR_COUNT * prior, np.full((1, g), est.PRIOR_COUNT)
  for _ in range(6):  # six verifications at 0.5 of every position, as Estimates.update takes them
    beta_sum, count = est.DECAY * beta_sum + 0.5, est.DECAY * count + 1.0
  device = beta_sum / count
  own = ages.own_ages(np.zeros((1, ages.AGES)), np.asarray([1]), np.asarray([16]), np.asarray([4]))  # 1st step
  curve = ages.AgeCurve.start(g)
  np.testing.assert_allclose(ages.predicted(beta_sum, count, prior, own, np.zeros((1, ages.AGES)), np.asarray([1]),
                                            curve), device)  # its own age: ratio 1
  flat = ages.AgeCurve.start(g)
  for given in (1, 12, 20, 40):
    flat.observe(np.full((4,), given), np.full((4,), 1000), np.full((4,), 500))
  np.testing.assert_allclose(ages.predicted(beta_sum, count, prior, own, np.zeros((1, ages.AGES)), np.asarray([40]),
                                            flat), device, rtol=0.02)  # the negative control: no age effect
  rising = ages.AgeCurve.start(g)
  for given, accepted in ((1, 500), (12, 550), (20, 600)):
    rising.observe(np.full((4,), given), np.full((4,), 1000), np.full((4,), accepted))
  older = ages.predicted(beta_sum, count, prior, own, np.zeros((1, ages.AGES)), np.asarray([20]), rising)
  assert (older > device + 0.02).all() and (older < 1).all()
  assert rising.alpha_of(ages.chain_share(0.7, g)) == pytest.approx(0.7, abs=1e-3)
  shared = ages._grid_shares(g)  # pylint: disable=protected-access  (the inverse's table: built once, read-only)
  assert shared is ages._grid_shares(g) and not shared.flags.writeable  # pylint: disable=protected-access
  np.testing.assert_array_equal(shared, ages.chain_share(ages._GRID, g))  # pylint: disable=protected-access
  unseen = ages.predicted(beta_sum, count, prior, own, np.zeros((1, ages.AGES)), np.asarray([100]), rising)
  assert rising.shares[ages.bucket(np.asarray([100]))[0]] == ages.UNSEEN and (unseen > older).all()
  # A row drafting 1 token an iteration at 0.5 counts as a gamma-4 chain at 0.5 (0.234 of its drafts), not 0.5.
  short = ages.AgeCurve.start(g)
  short.observe(np.asarray([1, 1]), np.asarray([1000, 1000]), np.asarray([500, 500]), np.asarray([1, 4]))
  assert short.accepted[0] == pytest.approx(1000 * ages.chain_share(0.5, g) + 500, rel=1e-3)


def test_the_choice_reads_the_estimates_carried_to_their_ages(engine, monkeypatch):
  """Budget.ages: the plan reads a row's estimates as ages.predicted carries them (raised where older rows accept
  more); off, the device's as they are."""
  slot = engine.free_slots()[0]
  engine.insert(slot, PROMPTS[0], RequestSettings(MAX_NEW))
  slots = np.asarray([slot])
  rising = ages.AgeCurve.start(engine.estimates().shape[1])
  for given, accepted in ((1, 300), (12, 900)):
    rising.observe(np.asarray([given]), np.asarray([1000]), np.asarray([accepted]))
  monkeypatch.setattr(engine, "age_curve", rising)
  for name in ("_prior_ages", "_left"):  # the row's prior taken at its first step; it gave 12 tokens
    monkeypatch.setattr(engine, name, getattr(engine, name).copy())
  engine._prior_ages[slot], engine._left[slot] = np.eye(ages.AGES)[0], MAX_NEW - 12  # pylint: disable=protected-access
  device = engine.estimates(slots)
  assert (engine._predicted(slots) > device + 0.05).all()  # pylint: disable=protected-access
  monkeypatch.setattr(engine, "budget", dataclasses.replace(engine.budget, ages=False))
  np.testing.assert_array_equal(engine._predicted(slots), device)  # pylint: disable=protected-access
  engine.free(slot)


def test_the_engine_pools_each_steps_verdicts_by_its_rows_ages(engine, monkeypatch):
  """Every drafting step's drafted and accepted tokens land in the age bucket of the tokens each row gave before
  it, and a finished request's verdict ages join the prior's mix."""
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.01))
  monkeypatch.setattr(engine, "age_curve", ages.AgeCurve.start(engine.estimates().shape[1]))
  slot = engine.free_slots()[0]
  engine.insert(slot, PROMPTS[0], RequestSettings(MAX_NEW))
  drafted, accepted, g = np.zeros((ages.AGES,)), np.zeros((ages.AGES,)), engine.estimates().shape[1]
  grid = np.linspace(0.0, 1.0, 100001)
  while engine.active_slots():
    given = int(engine._max_tokens[slot] - engine._left[slot])  # pylint: disable=protected-access
    out = engine.step()
    if out.drafted[slot]:
      b, limit = ages.bucket(np.asarray([given]))[0], int(out.limits[slot])
      share = out.accepted[slot] / out.drafted[slot]  # a shorter chain's: as a g-chain's at the same acceptance
      alpha = np.interp(share, ages.chain_share(grid, limit), grid)
      drafted[b] = ages.DECAY * drafted[b] + out.drafted[slot]
      accepted[b] = ages.DECAY * accepted[b] + ages.chain_share(alpha, g) * out.drafted[slot]
  assert drafted.sum() > 0
  np.testing.assert_allclose(engine.age_curve.drafted, drafted)
  np.testing.assert_allclose(engine.age_curve.accepted, accepted, rtol=1e-3)
  assert engine.age_curve.prior_ages.sum() == pytest.approx(1.0)


def test_the_verdicts_come_out_of_the_estimates_exactly():
  """`observed` takes a row's prior out of its estimates: against the verdicts' own decayed sum and count, tracked
  beside the device's update over random iterations (verified, relaxed, untouched), rows at different priors."""
  rng = np.random.default_rng(1)
  prior = rng.uniform(0.3, 0.95, (6, 4)).astype(np.float32)
  state = est.Estimates.prior_at(6, 4, prior)
  own_sum, own_count = np.zeros((6, 4)), np.zeros((6, 4))
  for _ in range(40):
    active = rng.random(6) < 0.8
    drafted = rng.integers(0, 5, 6).astype(np.int32)
    accepted = np.minimum(rng.integers(0, 5, 6), drafted).astype(np.int32)
    beta = rng.random((6, 4)).astype(np.float32) * (np.arange(4)[None] < drafted[:, None])
    verified = active[:, None] & (np.arange(4)[None] < np.minimum(accepted + 1, drafted)[:, None])
    relaxed = active[:, None] & ~verified
    own_sum = np.where(verified, est.DECAY * own_sum + beta, np.where(relaxed, est.RELAX * own_sum, own_sum))
    own_count = np.where(verified, est.DECAY * own_count + 1, np.where(relaxed, est.RELAX * own_count, own_count))
    state = state.update(jnp.asarray(active), jnp.asarray(drafted), jnp.asarray(accepted), jnp.asarray(beta))
  seen_sum, seen = est.observed(np.asarray(state.beta_sum, np.float64), np.asarray(state.count, np.float64),
                                prior.astype(np.float64))
  assert own_count.min() > 0.5 and own_count.max() > 5  # some verdicts, and different numbers of them
  np.testing.assert_allclose(seen, own_count, atol=2e-4)
  np.testing.assert_allclose(seen_sum, own_sum, atol=2e-4)
  # Negative control: taking the prior out at another prior (the one a fixed-prior engine assumes) misses.
  wrong_sum, _ = est.observed(np.asarray(state.beta_sum, np.float64), np.asarray(state.count, np.float64),
                              est.PRIOR_ALPHA)
  assert np.abs(wrong_sum - own_sum).max() > 0.1


def test_the_acceptance_prior_pools_the_served_requests_verdicts():
  prior = AcceptancePrior.start(3)
  np.testing.assert_allclose(prior.alpha, est.PRIOR_ALPHA)
  assert prior.alpha.dtype == np.float32 and prior.alpha.shape == (3,)
  # A request at the fixed prior that verified position 0 once (accepted), position 1 once (rejected), position 2
  # never (relaxed once): its estimates, as the device leaves them.
  row = est.Estimates.prior_at(1, 3)
  row = row.update(jnp.asarray([True]), jnp.asarray([2], jnp.int32), jnp.asarray([1], jnp.int32),
                   jnp.asarray([[1.0, 0.0]], jnp.float32))
  prior.observe(np.asarray(row.beta_sum[0]), np.asarray(row.count[0]), np.full((3,), est.PRIOR_ALPHA))
  np.testing.assert_allclose(prior.count, [1, 1, 0], atol=1e-5)
  np.testing.assert_allclose(prior.beta_sum, [1, 0, 0], atol=1e-5)
  # a(0) = (1 + 2 * 0.8) / 3; a(1) = (0 + 2 a(0)) / 3; a(2), without a verdict, a(1)
  np.testing.assert_allclose(prior.alpha, [2.6 / 3, 5.2 / 9, 5.2 / 9], rtol=1e-5)
  for _ in range(300):  # requests that verify every position 4 times at 0.3, 0.6, 0.9 (one verdict each)
    beta_sum, count = np.zeros(3), np.zeros(3)
    for _ in range(4):
      beta_sum, count = est.DECAY * beta_sum + [0.3, 0.6, 0.9], est.DECAY * count + 1
    m = est.PRIOR_COUNT * est.DECAY ** 4
    prior.observe(beta_sum + m * prior.alpha, count + m, prior.alpha)
  # about 34 verdicts a position now: the start's weight of 2 a tenth of the way to the position before
  np.testing.assert_allclose(prior.alpha, [0.3, 0.6, 0.9], atol=0.04)
  assert prior.count.min() > 30


def test_served_steps_move_their_row_buckets_curves_together():
  """A served step moves its bucket's curves (every tier's, the catch-up) by the factor that takes its own tier a
  `weight` of the way to its time: the machine's speed is learnt, the ratios the choice weighs stay warm-up's."""
  costs = CostCurves({(8, 0): 0.010, (8, 4): 0.020, (16, 0): 0.030}, catchup={8: 0.004, 16: 0.008})
  costs.observe(8, 4, 0.030, weight=0.1)  # 1.5x its curve: a tenth of the way, 1.05
  assert costs.seconds == pytest.approx({(8, 0): 0.0105, (8, 4): 0.021, (16, 0): 0.030})
  assert costs.catchup == pytest.approx({8: 0.0042, 16: 0.008})
  costs.observe(8, 0, 1.0, weight=0.5)  # a pause: counted as twice the curve
  assert costs.seconds[(8, 0)] == pytest.approx(0.01575) and costs.seconds[(8, 4)] == pytest.approx(0.0315)
  costs.observe(32, 0, 0.5, weight=0.5)  # not measured in warmup: left alone
  assert (32, 0) not in costs.seconds


def test_a_speed_change_on_the_side_it_runs_leaves_the_choice_as_it_was():
  """The machine 1.5x faster while plain steps run (a plain step at 8 rows learnt down from 30 to 20 ms) leaves
  the choice between plain and a gamma-4 tier at 8 rows as warm-up's curves made it; moving plain's curve alone (the
  rule before) would flip it to plain."""
  alpha, tiers = np.full((8, 4), 0.8), (0, 4)  # E(4) / E(0) = 3.36: gamma 4 wins at a cost ratio of 3.2
  costs = CostCurves({(8, 0): 0.030, (8, 4): 0.096})
  assert choose(alpha, tiers, [costs.get(8, k) for k in tiers], 0.2).k == 4
  for _ in range(60):
    costs.observe(8, 0, 0.020, weight=0.1)
  assert costs.get(8, 0) == pytest.approx(0.020, rel=0.01)
  assert costs.get(8, 4) / costs.get(8, 0) == pytest.approx(3.2)
  assert choose(alpha, tiers, [costs.get(8, k) for k in tiers], 0.2).k == 4
  assert choose(alpha, tiers, [costs.get(8, 0), 0.096], 0.2).k == 0  # plain's curve alone learnt: plain


def test_warmup_rounds_make_each_tier_plains_median_times_its_median_ratio():
  """Round r's timings of every tier make c(R, k): plain's median, times the median over the rounds of the tier's
  ratio to that round's plain step; a tier no round timed beside plain keeps its own median; untimed ones go."""
  curves = curves_from_rounds({0: [0.010, 0.020, None], 2: [0.025, 0.050, 0.090], 4: [None, None, None]})
  assert curves == pytest.approx({0: 0.015, 2: 0.0375})  # ratios 2.5, 2.5 (own median: 0.050)
  assert curves_from_rounds({1: [0.03, 0.01, 0.02]}) == pytest.approx({1: 0.02})


def test_warmup_curves_keep_the_tiers_ratios_through_a_slow_spell(engine, monkeypatch):
  """Warm-up interleaves the tiers round by round, so a machine 2.5x slower for 8 steps times every tier of most rounds
  at one speed, and it times a step after one of the same program, so what a switch between programs adds is left
  out, and a plain step only after its settle (budget.settle_steps: 3 plain steps after a drafting one, which cost
  more here: 0.4, then 0.3 and 0.1; timed at the second step, as warm-up did before, plain read 1.3 in half the
  rounds and each tier's ratio low): the curves' ratio of each tier to plain is the true one. (Timed tier after tier
  in two passes, the second reversed, the lower median, as warm-up did before that: the spell covers the widest
  tier's steps in both passes, and its curve reads 2.5x dearer.) At 1 row (below budget.FEW_ROWS) it runs 4x the
  rounds."""
  true = {0: 1.0, 1: 1.7, 2: 2.3, 3: 2.9}
  clock, steps, last, by_rows, plain_run = [0.0], [0], [None], collections.Counter(), [0]
  real_step = engine.step

  def step(program=None, limits=None):
    out = real_step(program=program, limits=limits)
    steps[0] += 1
    by_rows[program[2]] += 1
    k = engine.table.entries[program[0]].gamma
    clock[0] += true[k] * (2.5 if 13 <= steps[0] <= 20 else 1.0)
    clock[0] += 0.4 if program != last[0] else 0.0  # a step right after another program costs more
    plain_run[0] = plain_run[0] + 1 if k == 0 else 0  # plain steps in a row
    clock[0] += {2: 0.3, 3: 0.1}.get(plain_run[0], 0.0)  # plain settles over three steps
    last[0] = program
    return out

  monkeypatch.setattr(engine, "step", step)
  monkeypatch.setattr(engine_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
  monkeypatch.setattr(engine, "budget", dataclasses.replace(engine.budget, repeats=3))
  monkeypatch.setattr(engine, "costs", CostCurves())
  engine._measure_costs()  # pylint: disable=protected-access
  assert steps[0] > 40  # the spell falls inside the first row bucket's rounds
  # rounds x (3 drafting tiers x 2 steps + plain's 4)
  assert engine.row_buckets == (1, 3) and by_rows[1] - by_rows[3] == 3 * 6 * (3 * 2 + 4)
  # plain's settle after drafting: 0.4 + 0.3 + 0.1 beyond three steady steps (the median over the reversed rounds)
  assert engine.costs.settle == pytest.approx({1: 0.8, 3: 0.8})
  for rows in engine.row_buckets:
    base = engine.costs.seconds[(rows, 0)]
    assert 1.0 - 1e-9 <= base <= 2.5 + 1e-9
    for k, cost in true.items():
      assert engine.costs.seconds[(rows, k)] / base == pytest.approx(cost), (rows, k)
  assert not engine.active_slots()


def test_a_level_step_moves_its_side_or_its_tier_alone():
  """A step that sets levels moves the curves of its side alone (plain, or every drafting tier: the first learnt
  step after a switch) or of its tier alone (a probe of another tier of the running side), never the catch-up;
  anything else for `levels` is refused."""
  costs = CostCurves({(8, 0): 0.010, (8, 2): 0.020, (8, 4): 0.030, (16, 4): 0.060}, catchup={8: 0.004})
  costs.observe(8, 4, 0.015, weight=0.5, levels=SIDE)  # half the curve: halfway, 0.75
  assert costs.seconds == pytest.approx({(8, 0): 0.010, (8, 2): 0.015, (8, 4): 0.0225, (16, 4): 0.060})
  assert costs.catchup == {8: 0.004}
  costs.observe(8, 0, 0.020, weight=0.5, levels=SIDE)
  assert costs.seconds == pytest.approx({(8, 0): 0.015, (8, 2): 0.015, (8, 4): 0.0225, (16, 4): 0.060})
  costs.observe(8, 4, 0.045, weight=0.5, levels=TIER)  # twice the curve: halfway, 1.5, gamma 4's alone
  assert costs.seconds == pytest.approx({(8, 0): 0.015, (8, 2): 0.015, (8, 4): 0.03375, (16, 4): 0.060})
  assert costs.catchup == {8: 0.004}
  with pytest.raises(ValueError, match="levels"):
    costs.observe(8, 4, 0.045, weight=0.5, levels="bucket")


def test_side_runs_tell_what_a_step_learns():
  """Runs of one side at one row bucket, a switch (the other side, same bucket) told from a change of bucket; the
  first learnt step after a run of the other side longer than a probe sets its side's level, past its settle (a
  drafting side's second step, plain's fourth: budget.settle_steps); a probe's settle is not learnt from and its next
  step sets its side's level (the other side's tier: two steps of drafting, four of plain) or its tier's (another
  tier of the running side); a step of another tier ends the probe. A bucket's clock is its steps' seconds."""
  runs = SideRuns(share=0.02)
  assert runs.ran(8, 0, 1.0) == Run(rows=8, drafting=False, steps=1, after_switch=False)
  assert runs.ran(8, 0, 1.0).steps == 2
  assert runs.ran(8, 2, 0.5) == Run(rows=8, drafting=True, steps=1, after_switch=True, before=2, crossed=True)
  assert runs.ran(8, 4, 0.5).levels is None  # after a run as short as a probe: the speed
  # a probe's return: plain, its settle not learnt from, then no level (the drafting run before was a probe's)
  assert [(r.steps, r.learnt, r.levels) for r in (runs.ran(8, 0, 0.5) for _ in range(5))] == [
      (1, False, None), (2, False, None), (3, False, None), (4, True, None), (5, True, None)]
  assert [runs.ran(8, 2, 0.5).levels for _ in range(3)] == [None, SIDE, None]  # after 5 plain steps: its level
  assert [runs.ran(8, 0, 0.5).levels for _ in range(5)] == [None, None, None, SIDE, None]  # plain's, past its settle
  assert runs.ran(4, 2, 1.0).after_switch is False  # another row bucket: not a switch
  assert runs.clocks == {8: 9.5, 4: 1.0} and (runs.seen[(8, 2)], runs.seen[(8, 4)], runs.sides[(8, True)]) == (
      7.0, 3.0, 7.0)  # each bucket's clock: its steps' seconds
  limits = np.zeros((4,), np.int32)
  wide, narrow = Choice(3, 4, limits, 10.0, 0.03), Choice(2, 2, limits, 8.0, 0.02)
  runs.start(4, narrow, wide, home=2)  # a probe of gamma 4 from gamma 2: its second step, gamma 4's level
  assert runs.probing(4) == 3 and runs.current(2) == 2
  first, second = runs.ran(4, 4, 1.0), runs.ran(4, 4, 1.0)
  assert (first.learnt, first.probe_step, second.learnt, second.levels) == (False, 1, True, TIER)
  assert runs.probing(4) is None and runs.ran(4, 2, 1.0).levels is None  # the probe is over: the speed again
  runs.start(4, narrow, Choice(0, 0, limits, 4.0, 0.01), home=2)  # of plain from drafting: its side's level
  assert [(r.learnt, r.levels) for r in (runs.ran(4, 0, 1.0) for _ in range(4))] == [
      (False, None), (False, None), (False, None), (True, SIDE)]
  assert runs.probe is None  # four steps, its settle and the learnt one
  runs.start(4, narrow, wide, home=2)
  runs.ran(4, 4, 1.0)
  assert runs.ran(4, 1, 1.0).probe is None and runs.probe is None  # another tier: the probe ends
  runs.start(4, narrow, wide, home=2)
  assert runs.probing(8) is None and runs.probe is None  # another row bucket: dropped
  assert runs.current(1) == 2 and runs.current(1) == 1  # the tier before the probe, once


def test_side_runs_probe_a_tier_when_its_loss_allows():
  """A probe of the other side's best tier or of the running side's other tiers is due when it last ran longer ago
  (on its bucket's clock) than its expected loss over its share of the share (split among the candidates); the
  longest overdue runs; never one that scores more (the choice switches itself), nor with no share. A probe of the
  other side also pays its crossing (the catch-up, the quiet rows' wakes); one of the running side's does not."""
  runs = SideRuns(share=0.02)
  limits = np.zeros((8,), np.int32)
  drafting = Choice(tier=3, k=4, limits=limits, expected=12.0, cost=0.033)
  plain = Choice(tier=0, k=0, limits=limits, expected=4.0, cost=0.010, other=drafting)

  def due(choice, clock, crossing=0.0):
    rows = 8 if choice is not None else 16
    runs.clocks[rows] = clock
    return runs.due(rows, choice if choice is not None else plain, crossing)

  # loss: 2 steps of 33 ms for 12 tokens each, which plain gives in 30 (6 ms), and a switch there and back: a tenth
  # of the two steps (4.3 ms); over 2 %: due 0.515 s after the side last ran at that row bucket.
  runs.sides[(8, True)], runs.seen[(8, 4)] = 2.0, 1.0  # drafting last ran at 8 rows at 2 s (at gamma 4 at 1 s)
  assert due(plain, 2.51) is None and due(plain, 2.52) is drafting
  # A crossing of 10.3 ms (the wakes, the catch-up) doubles the loss: due 1.03 s after.
  assert due(plain, 3.02, crossing=0.0103) is None and due(plain, 3.04, crossing=0.0103) is drafting
  assert due(None, 10.0) is None and due(None, 10.52) is drafting  # never ran at 16 rows: from the first plan
  assert SideRuns(share=0.0, clocks={8: 100.0}).due(8, plain) is None
  assert due(dataclasses.replace(plain, other=dataclasses.replace(drafting, cost=0.029)), 100.0) is None
  assert due(dataclasses.replace(plain, other=None), 100.0) is None
  # Drafting at gamma 2 (9 tokens in 20 ms), plain and gamma 4 the candidates, 1 % each. Gamma 4: 2 steps of 33 ms
  # for 12 tokens, 26.7 ms at gamma 2's rate (12.7 ms), and a tenth of 53 ms: 18.0 ms, due 1.80 s after gamma 4
  # last ran there. Plain (4 tokens in 10 ms, 8.9 at gamma 2's rate; its probe 4 steps, budget.settle_steps):
  # 4.4 + 3 ms, due 0.74 s after plain last ran.
  two = Choice(tier=2, k=2, limits=limits, expected=9.0, cost=0.020,
               other=dataclasses.replace(plain, other=None), rivals=(drafting,))
  runs.seen[(8, 4)], runs.sides[(8, False)] = 5.0, 6.5
  assert due(two, 6.79) is None and due(two, 6.80).k == 4
  assert due(two, 7.03).k == 4  # gamma 4 has waited 1.13 times its time, plain 0.71
  assert due(two, 7.5).k == 4  # both due: 1.39 against 1.34
  assert due(two, 8.0).k == 0  # 1.67 against 2.02
  assert due(dataclasses.replace(two, rivals=()), 6.86) is None  # plain alone, 2 %: due at 6.87 s
  assert due(dataclasses.replace(two, rivals=()), 6.88).k == 0
  assert due(dataclasses.replace(two, other=None), 5.89) is None  # gamma 4 alone: due at 5.90 s
  assert due(dataclasses.replace(two, other=None), 5.90).k == 4
  assert due(dataclasses.replace(two, other=None), 5.90, crossing=1.0).k == 4  # the same side: no crossing
  assert due(dataclasses.replace(two, rivals=()), 6.88, crossing=0.005) is None  # the other side: plain pays it


def _serve_on_a_fake_clock(engine, refs, monkeypatch, read, per_token, share) -> list:
  """PROMPTS * 8 through `engine` under a budget with probes of `share`, its steps timed by a fake clock (c(k) =
  1 + per_token k at every row bucket) and its warm-up curves those times with tier k's multiplied by read[k]
  (a warm-up that read tiers too dear); greedy tokens checked against plain decoding. The served steps' draft
  lengths (0: plain)."""
  clock, keys = [0.0], {id(p): key for key, p in engine._programs.items()}  # pylint: disable=protected-access
  real_step = engine_module.STEP

  def step(prog, *args):
    clock[0] += 1.0 + per_token * engine.table.entries[keys[id(prog)][0]].gamma
    return real_step(prog, *args)

  monkeypatch.setattr(engine_module, "STEP", step)
  monkeypatch.setattr(engine_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
  monkeypatch.setattr(engine, "ends", EndRate())
  true = cost_curves(engine, per_token=per_token)
  monkeypatch.setattr(engine, "costs", CostCurves({key: c * read.get(key[1], 1.0)
                                                   for key, c in true.seconds.items()}))
  monkeypatch.setattr(engine, "budget", Budget(margin=0.0, learn=0.1, idle=0.0, probe=share))
  monkeypatch.setattr(engine, "_runs", SideRuns(share=share))
  monkeypatch.setattr(engine, "_last", None)  # no previous step's side for the stick to keep
  outputs = []
  requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS * 8)]
  drive(engine, requests, outputs=outputs)
  assert [r.tokens for r in requests] == refs * 8
  return [o.entry.gamma for o in outputs if o.entry is not None]


def test_the_stick_weighs_over_the_same_rows_only(engine, monkeypatch):
  """The stick keeps the previous step's side over about the same rows; when more than a quarter of the rows changed
  (a request alone ended and the next took its slot) the choice is fresh: at concurrency 1 each request otherwise
  started on the one before's side."""
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.02))  # drafting nearly free: it wins
  monkeypatch.setattr(engine, "budget", Budget(margin=0.0, learn=0.0, idle=0.0, stick=5.0, probe=0.0))
  slot = engine.free_slots()[0]
  engine.insert(slot, PROMPTS[0], RequestSettings(MAX_NEW, ignore_eos=True))
  (_, mode, rows), _ = engine.plan_step()
  assert engine.plan_step()[0][0] > 0  # fresh: drafting
  engine.step(program=(0, mode, rows))
  assert engine.plan_step()[0][0] == 0  # after a plain step over the same row: the stick keeps plain
  engine.free(slot)
  engine.insert(slot, PROMPTS[1], RequestSettings(MAX_NEW, ignore_eos=True))  # the next request, the same slot
  assert engine.plan_step()[0][0] > 0  # another row: fresh
  engine.free(slot)


def test_probes_correct_a_warmup_that_read_drafting_too_dear(engine, refs, monkeypatch):
  """Warm-up read every drafting tier 3x dearer than its steps take (a fake clock: c(k) = 1 + 0.02 k): the budget
  starts plain. Probes run drafting now and then, its first learnt steps bring its side's curves toward their
  times, and the budget drafts at most of the later steps, exactly. Without probes (share 0) it decodes plain
  throughout: nothing of drafting is served, so nothing corrects it."""
  read = {k: 3.0 for k in range(1, 4)}
  probed = _serve_on_a_fake_clock(engine, refs, monkeypatch, read, 0.02, 0.25)
  later = probed[len(probed) // 2:]
  assert sum(k > 0 for k in later) > 0.5 * len(later), probed
  unprobed = _serve_on_a_fake_clock(engine, refs, monkeypatch, read, 0.02, 0.0)
  assert not any(unprobed), unprobed


def test_probes_correct_a_warmup_that_read_the_widest_tier_too_dear(engine, refs, monkeypatch):
  """Warm-up read the widest tier (3) 1.3x dearer than its steps take, where every tier's step takes as long (a
  fake clock): the budget starts at a narrower tier. Probes of the running side's other tiers run it now and then
  and their learnt steps bring its curve toward its time: at the busiest row bucket within a tenth of the others'
  (1.3 before; the other tiers' ratios stay within 5 %), and the widest tier serves a quarter of the later steps,
  exactly. Without probes its curve stays 1.3x the others' and it never runs."""
  read, busiest = {3: 1.3}, max(engine.row_buckets)

  def ratios():
    return [engine.costs.seconds[(busiest, k)] / engine.costs.seconds[(busiest, 2)] for k in (0, 1, 3)]

  probed = _serve_on_a_fake_clock(engine, refs, monkeypatch, read, 0.0, 0.25)
  plain, one, widest = ratios()
  assert widest < 1.1 and (plain, one) == pytest.approx((1.0, 1.0), rel=0.05), (plain, one, widest)
  later = probed[len(probed) // 2:]
  assert sum(k == 3 for k in later) >= 0.25 * len(later), probed
  unprobed = _serve_on_a_fake_clock(engine, refs, monkeypatch, read, 0.0, 0.0)
  assert ratios() == pytest.approx([1.0, 1.0, 1.3]) and 3 not in unprobed and any(unprobed), unprobed


def test_the_engine_learns_its_costs_and_its_end_rate(engine, refs, monkeypatch):
  """A step the plan chose after a step of the same program moves its row bucket's costs toward its time (learn 1:
  halfway at most, the clip); a forced one, one after a switch, and an engine that does not learn leave the
  curves alone. Requests that end by EOS raise the end
  rate, ignore_eos ones do not."""
  big = CostCurves({key: 1e3 for key in engine.costs.seconds})  # far above any step: each observed one halves
  monkeypatch.setattr(engine, "costs", big)
  monkeypatch.setattr(engine, "ends", EndRate())
  slot = engine.free_slots()[0]
  engine.insert(slot, PROMPTS[0], RequestSettings(MAX_NEW, ignore_eos=True))
  out = engine.step(program=(0, "greedy", 3))
  assert all(v == 1e3 for v in big.seconds.values())  # forced: not learnt
  out = engine.step()  # AS_SET: learn 0
  assert all(v == 1e3 for v in big.seconds.values())
  monkeypatch.setattr(engine, "budget", Budget(margin=0.0, learn=1.0))
  out = engine.step()  # the program of the step before (same costs, same estimates): learnt
  learnt = (out.rows, out.entry.gamma)
  assert big.seconds[learnt] == pytest.approx(500.0)  # and its row bucket's other tiers with it
  assert all(v == (500.0 if key[0] == out.rows else 1e3) for key, v in big.seconds.items())
  engine.step(program=(0, "greedy", 3) if out.entry.gamma else (1, "greedy", 3))
  engine.step()  # right after another program (whose tokens' streaming a server would charge to it): not learnt
  assert big.seconds[learnt] == pytest.approx(500.0)
  engine.free(slot)
  assert engine.ends.rate == 0.0  # ignore_eos: not counted
  requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS)]
  drive(engine, requests)
  assert [r.tokens for r in requests] == refs
  stops = sum(1 for r in requests if len(r.tokens) < MAX_NEW)
  assert stops and engine.ends.ends > 0 and engine.ends.rate > 0, (stops, engine.ends)


def test_a_drafting_step_after_another_drafting_tier_is_learnt(engine, monkeypatch):
  """Served, the budget moves between drafting tiers: a planned drafting step right after a step of another
  drafting tier at the same row bucket refines its cost (learn 1: halfway, the clip); one right after a plain step
  does not (the switch's streaming)."""
  big = CostCurves({key: 1e3 for key in engine.costs.seconds})
  monkeypatch.setattr(engine, "costs", big)
  monkeypatch.setattr(engine, "budget", Budget(margin=0.0, learn=1.0, idle=0.0, stick=0.0))
  slot = engine.free_slots()[0]
  engine.insert(slot, PROMPTS[0], RequestSettings(MAX_NEW, ignore_eos=True))
  (_, mode, rows), _ = engine.plan_step()
  # The widest tier is forced below; so dear that the plan never picks it itself (a tier's cost is at least a
  # narrower one's: the widest alone leaves the others as they are).
  other = len(engine.table.entries) - 1
  big.seconds[(rows, engine.table.entries[other].gamma)] = 1e6
  engine.step(program=(0, mode, rows))
  out = engine.step()  # right after a plain step: not learnt
  assert out.entry.gamma > 0 and out.rows == rows  # the prior's estimates draft at equal costs
  assert all(v == 1e3 for key, v in big.seconds.items() if key[1] != engine.table.entries[other].gamma)
  engine.step(program=(other, mode, rows))
  out = engine.step()  # right after another drafting tier at the same rows: learnt
  assert out.entry.gamma > 0 and out.entry.gamma != engine.table.entries[other].gamma and out.rows == rows
  assert big.seconds[(rows, out.entry.gamma)] == pytest.approx(500.0)
  engine.free(slot)


def test_the_margin_counts_against_drafting():
  # alpha 0.9, a tier of 4 at 3.5 plain steps: E / c = 4.1 / 3.5 = 1.17 against plain's 1; with a margin of 0.2
  # its cost counts as 4.2 and plain wins; a tier far ahead (cost 2) drafts either way. The default is no margin.
  alpha, tiers = np.full((4, 4), 0.9), (0, 4)
  assert Budget().margin == 0.0 and choose(alpha, tiers, [1.0, 3.5], 0.2, margin=Budget().margin).k == 4
  assert choose(alpha, tiers, [1.0, 3.5], 0.2, margin=0.2).k == 0
  assert choose(alpha, tiers, [1.0, 2.0], 0.2, margin=0.2).k == 4


def test_a_draft_prefill_per_token_counts_against_drafting():
  # One row at alpha 0.8, a tier of 4 at twice plain's cost: E(4) = 1 + 0.8 + ... + 0.8^4 = 3.3616 tokens, score
  # 1.68 against plain's 1. A prefill of 0.5 s per token of the row's request raises the tier's cost by 0.5 E(4):
  # 3.68, and plain wins; plain's own cost never includes it.
  alpha, tiers, e4 = np.full((1, 4), 0.8), (0, 4), 1 + 0.8 + 0.8 ** 2 + 0.8 ** 3 + 0.8 ** 4
  assert choose(alpha, tiers, [1.0, 2.0], 0.2).k == 4
  assert choose(alpha, tiers, [1.0, 2.0], 0.2, per_token=np.zeros(1)).k == 4
  plain = choose(alpha, tiers, [1.0, 2.0], 0.2, per_token=np.asarray([0.5]))
  assert plain.k == 0 and plain.cost == pytest.approx(1.0)
  drafting = choose(alpha, (4,), [2.0], 0.2, per_token=np.asarray([0.5]))
  assert drafting.cost == pytest.approx(2.0 + 0.5 * e4)


def test_the_engine_charges_each_row_its_prefill_over_its_length(engine, monkeypatch):
  """warmup timed the draft's prefill at every prompt bucket; a row's share per token is its bucket's prefill
  over the tokens it buys: a quiet row's over those it has left (its wake is still to pay), a woken row's over its
  request's expected length (an ignore-EOS request: its max_tokens; the steady state). A probe of drafting from
  plain counts the quiet rows' wakes, and the catch-up only once a draft has rested; one of plain, the catch-up
  alone (the return re-feeds)."""
  assert sorted(engine.costs.wake) == sorted(engine.buckets) and all(w > 0 for w in engine.costs.wake.values())
  assert "wake" in engine.costs.lines()[-1]
  slot = engine.free_slots()[0]
  engine.insert(slot, PROMPTS[0], RequestSettings(MAX_NEW, ignore_eos=True))
  bucket = next(b for b in sorted(engine.buckets) if b >= len(PROMPTS[0]))
  slots, wake = np.asarray([slot]), engine.costs.wake[bucket]
  def per_token():
    return engine._prefill_per_token(slots, engine._left[slots], np.zeros(1))  # pylint: disable=protected-access
  def crossing(choice):
    return engine._crossing(slots, rows, choice)  # pylint: disable=protected-access
  assert engine._left[slot] == MAX_NEW - 1 and per_token() == pytest.approx([wake / (MAX_NEW - 1)])
  (_, mode, rows), _ = engine.plan_step()
  catchup = 0.005  # the tiny models' catch-up can time at 0: set, so that counting it shows
  monkeypatch.setitem(engine.costs.catchup, rows, catchup)
  drafting = Choice(1, 1, np.zeros((1,), np.int32), 1.0, 1.0)
  plain = dataclasses.replace(drafting, tier=0, k=0)
  # Nothing rested yet: from plain the wake alone; from drafting the return's catch-up.
  assert crossing(plain) == pytest.approx(wake) and crossing(drafting) == pytest.approx(catchup)
  engine.step(program=(0, mode, rows))  # a plain step: the draft rests, the row stays quiet
  assert crossing(plain) == pytest.approx(catchup + wake) and crossing(drafting) == pytest.approx(catchup)
  engine.step(program=(len(engine.table.entries) - 1, mode, rows))  # a drafting step wakes it and catches up
  assert per_token() == pytest.approx([wake / MAX_NEW])
  assert crossing(plain) == 0.0 and crossing(drafting) == pytest.approx(catchup)
  engine.free(slot)


def test_a_rested_draft_pays_its_catch_up_spread_over_the_drafting_it_buys():
  alpha, tiers, costs = np.full((4, 4), 0.9), (0, 4), [1.0, 2.5]
  behind = np.ones((4,), bool)
  assert choose(alpha, tiers, costs, 0.2, behind=~behind, catchup=5.0).k == 4  # caught up: 4.1 / 2.5 > 1
  # Rested rows: the re-feed (5) makes one drafting step cost 7.5, more than its 4.1 tokens are worth...
  assert choose(alpha, tiers, costs, 0.2, behind=behind, catchup=5.0).k == 0
  # ... but rows with 64 tokens left draft about 3.9 steps on it: 2.5 + 5 / 3.9 = 3.78 for 65.6 tokens against 16.
  far = choose(alpha, tiers, costs, 0.2, left=np.full((4,), 64), iterations=4, behind=behind, catchup=5.0)
  assert far.k == 4 and far.cost == pytest.approx(2.5 + 5.0 / (64 / (4 * 4.0951)))


def test_drafting_from_plain_pays_the_returns_settle_spread_over_the_drafting_it_buys():
  """After a plain step every drafting tier pays plain's settle (the return's first plain steps' excess,
  CostCurves.settle) once, spread over its expected drafting steps as the catch-up; the two add up. Plain itself
  never pays it (from drafting the return is owed whichever side runs), and without `settle` nothing changes."""
  alpha, tiers, costs = np.full((4, 4), 0.9), (0, 4), [1.0, 2.5]
  left = np.full((4,), 64)
  free = choose(alpha, tiers, costs, 0.2, left=left, iterations=4)
  assert free.k == 4 and free.cost == pytest.approx(2.5)
  spread = 64 / (4 * 4.0951)  # 3.9 drafting steps
  paid = choose(alpha, tiers, costs, 0.2, left=left, iterations=4, settle=3.0)
  assert paid.k == 4 and paid.cost == pytest.approx(2.5 + 3.0 / spread)
  both = choose(alpha, tiers, costs, 0.2, left=left, iterations=4, behind=np.ones((4,), bool), catchup=5.0,
                settle=3.0)
  assert both.k == 0 and both.other.cost == pytest.approx(2.5 + 8.0 / spread)  # 65.5 tokens in 4.55: plain's 16 in 1
  assert choose(alpha, tiers, costs, 0.2, left=left, iterations=4, settle=6.0).k == 4  # 4.04 for 65.5
  assert choose(alpha, tiers, costs, 0.2, left=left, iterations=4, settle=6.5).k == 0  # 4.16
  plain = choose(alpha, tiers, [1.0, 4.5], 0.2, left=left, iterations=4, settle=3.0)
  assert plain.k == 0 and plain.cost == pytest.approx(1.0)


def test_the_engine_tracks_rested_drafts_and_times_their_catch_up(engine):
  assert all(v >= 0 for v in engine.costs.catchup.values())
  plain, drafting = (0, "greedy", 3), (len(engine.table.entries) - 1, "greedy", 3)
  slots = []
  for p in PROMPTS[:2]:
    slots.append(engine.free_slots()[0])
    engine.insert(slots[-1], p, RequestSettings(MAX_NEW))
  assert not engine._behind[slots].any()  # pylint: disable=protected-access  (a new row's draft is current)
  engine.step(program=plain)
  assert engine._behind[engine.active_slots()].all()  # pylint: disable=protected-access
  engine.step(program=drafting)
  assert not engine._behind.any()  # pylint: disable=protected-access  (they drafted: caught up)
  for slot in engine.active_slots():
    engine.free(slot)


def test_a_plain_step_leaves_a_lagging_drafts_state_out(engine):
  """A draft model lags through plain steps (its idle and settle leave its state as it is), so the plain tier's
  programs run without it, as a plain engine's do: the draft's state after a plain step is the state before it,
  and the rows still decode exactly (the greedy tests above run through these programs)."""
  programs = engine._programs  # pylint: disable=protected-access
  assert all(programs[k].draft_outside == engine.table.entries[k[0]].plain for k in programs)
  slots = []
  for p in PROMPTS[:2]:
    slots.append(engine.free_slots()[0])
    engine.insert(slots[-1], p, RequestSettings(MAX_NEW))
  engine.step(program=(len(engine.table.entries) - 1, "greedy", 3))  # wakes and drafts
  state = lambda: jax.tree_util.tree_leaves(engine._state.draft_state)  # pylint: disable=protected-access
  before = [np.asarray(x) for x in state()]
  out = engine.step(program=(0, "greedy", 3))
  assert sum(len(t) for t in out.tokens) > 0
  after = state()
  assert len(before) == len(after) and all(np.array_equal(b, np.asarray(a)) for b, a in zip(before, after))
  for slot in engine.active_slots():
    engine.free(slot)


def test_a_head_rests_inside_the_plain_step():
  """A feature head keeps its state in sync through plain steps (Drafter.idle reads the target's features), so its
  plain programs carry it."""
  target, speculation = _case("head")
  e = SlotEngine(target, speculation, slots=2, max_input_length=32, max_new_tokens=MAX_NEW, iterations_per_step=1,
                 modes=("greedy",), budget=AS_SET)
  assert not any(p.draft_outside for p in e._programs.values())  # pylint: disable=protected-access


def test_the_servers_flags_make_the_budget():
  kw = dict(speculation="budget", drafts=True, table=False, tiers=[], theta=0.3, margin=0.1)
  assert budget_flags(**kw) == Budget(theta=0.3, margin=0.1)
  assert budget_flags(**{**kw, "tiers": ["1", "3"]}).tiers == (1, 3)
  assert budget_flags(**kw, probe=0.0).probe == 0.0 and budget_flags(**kw).probe == Budget().probe > 0
  for off in ({"speculation": "fixed"}, {"drafts": False}, {"table": True}):
    assert budget_flags(**{**kw, **off}) is False
  with pytest.raises(SettingsError, match="--budget_tiers takes integers, got 1,x"):
    budget_flags(**{**kw, "tiers": ["1", "x"]})


def test_budget_settings_are_checked():
  assert Budget().tiers_for(4) == (0, 1, 2, 4) and Budget().tiers_for(6) == (0, 1, 2, 4, 6)
  assert Budget().tiers_for(1) == (0, 1) and Budget(tiers=(2,)).tiers_for(5) == (0, 2, 5)
  with pytest.raises(SettingsError, match="go beyond the speculation's gamma=3"):
    Budget(tiers=(1, 4)).tiers_for(3)
  for bad in ({"tiers": ()}, {"tiers": (-1,)}, {"tiers": "12"}, {"theta": 1.5}, {"repeats": 0}, {"margin": -0.1},
              {"margin": float("nan")}, {"margin": True}, {"learn": 1.5}, {"learn": -0.1}, {"learn": True},
              {"idle": 2.0}, {"idle": -1}, {"stick": -0.1}, {"stick": True}, {"probe": 1.0}, {"probe": True},
              {"hold": -1}, {"hold": 1.5}, {"hold": True}, {"ages": 1}, {"lengths": "yes"}):
    with pytest.raises(SettingsError):
      Budget(**bad)
  assert CostCurves().get(8, 2) == pytest.approx(1.2)  # the relative model before warmup measured


def test_device_update_matches_numpy():
  rng = np.random.default_rng(0)
  prior = rng.uniform(0.3, 0.95, (5, 4)).astype(np.float32)  # each row's own (its relaxations' target)
  state = est.Estimates.prior_at(5, 4, prior)
  s, c = np.asarray(state.beta_sum), np.asarray(state.count)
  for _ in range(6):
    active = rng.random(5) < 0.8
    drafted = rng.integers(0, 4, 5).astype(np.int32)  # up to 3 of the 4 positions (a shorter tier)
    accepted = np.minimum(rng.integers(0, 4, 5), drafted).astype(np.int32)
    beta = (rng.random((5, 3)) * (np.arange(3)[None] < drafted[:, None])).astype(np.float32)
    state = state.update(jnp.asarray(active), jnp.asarray(drafted), jnp.asarray(accepted), jnp.asarray(beta))
    s, c = _np_update(s, c, active, drafted, accepted, beta, prior)
  np.testing.assert_allclose(np.asarray(state.beta_sum), s, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(state.count), c, rtol=1e-5)


# -- engines ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def refs():
  target = _llama(0)
  return [generate_tokens(target, p, MAX_NEW) for p in PROMPTS]


@pytest.fixture(scope="module")
def engine():
  """A draft model (partly accepted) under the default budget, 3 slots, warmed up (programs and cost curves)."""
  target, speculation = _case("draft")
  e = SlotEngine(target, speculation, slots=3, max_input_length=32, max_new_tokens=MAX_NEW, iterations_per_step=1,
                 modes=("greedy",), row_buckets=(1, 3), budget=AS_SET)
  e.warmup()
  return e


def _serve_prompts(engine, refs) -> list:
  """Every prompt through `engine` (arriving one a step), its greedy tokens checked against plain decoding; the
  engine's step outputs."""
  outputs = []
  requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS)]
  drive(engine, requests, outputs=outputs)
  assert [r.tokens for r in requests] == refs
  return outputs


def test_warmup_measures_every_cost_and_compiles_a_bounded_set(engine, refs):
  tiers = [e.gamma for e in engine.table.entries]
  assert tiers == [0, 1, 2, 3] and engine.budget is not None
  assert len(engine.programs) == len(tiers) * len(engine.modes) * len(engine.row_buckets)  # 4 x 1 x 2
  assert sorted(engine.costs.seconds) == sorted((r, k) for r in engine.row_buckets for k in tiers)
  assert all(c > 0 for c in engine.costs.seconds.values())
  assert engine.costs.lines()[0].startswith("rows 1: k=0 ")
  before = engine.compiled_programs()
  requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS)]
  drive(engine, requests)
  assert [r.tokens for r in requests] == refs
  assert engine.compiled_programs() == before


def test_forced_costs_make_it_plain_everywhere(engine, refs, monkeypatch):
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=5.0))
  outputs = _serve_prompts(engine, refs)
  ran = [o for o in outputs if o.entry is not None]
  assert ran and all(o.entry.gamma == 0 and not o.limits.any() and not o.drafted.any() for o in ran)


def test_the_next_tier_is_chosen_while_a_step_runs(engine, refs, monkeypatch):
  """Budget.ahead: a step of enough rows has the next step's tier chosen during its device work; the next plan
  takes that tier with each row's limit from the estimates then, and calls `choose` only when the rows changed.
  Greedy output stays plain decoding's; with ahead=0 every plan chooses afresh and none is made during a step."""
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.3))
  calls = []
  real = engine_module.choose
  monkeypatch.setattr(engine_module, "choose", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
  monkeypatch.setattr(engine, "budget", dataclasses.replace(engine.budget, ahead=0, hold=0))
  _serve_prompts(engine, refs)
  assert calls and engine._ahead is None  # pylint: disable=protected-access
  monkeypatch.setattr(engine, "budget", dataclasses.replace(engine.budget, ahead=2, hold=0))
  calls.clear()
  for p in PROMPTS[:3]:
    engine.insert(engine.free_slots()[0], p, RequestSettings(MAX_NEW, ignore_eos=True))
  slots = np.asarray(engine.active_slots())
  engine.step()
  assert len(calls) == 2  # the plan, then the next one's tier during the step
  ahead = engine._ahead  # pylint: disable=protected-access
  assert ahead is not None and ahead.requests.tolist() == engine._serial[slots].tolist() and ahead.rows == 3
  key, limits = engine.plan_step()
  assert len(calls) == 2  # taken as chosen
  entry = engine.table.entries[key[0]]
  assert key[0] == ahead.tier or (key[0] == 0 and not limits.any())
  np.testing.assert_array_equal(limits[slots], row_limits(survival(engine.estimates(slots)), entry.gamma,
                                                          engine.budget.theta))
  engine.step(program=key, limits=limits)  # the plan's step, as hosts.Leader runs it: the next tier meanwhile
  assert engine._ahead is not None and len(calls) == 3  # pylint: disable=protected-access
  engine.step(program=key)  # a forced step (warmup's, a follower's) plans nothing ahead, and drops what was
  assert engine._ahead is None and len(calls) == 3  # pylint: disable=protected-access
  for slot in engine.active_slots():
    engine.free(slot)
  outputs = _serve_prompts(engine, refs)  # arriving one a step: the plans made ahead run, and stay exact
  assert len(calls) < len(outputs) * 2


def _plain_held(engine, monkeypatch, ahead: int) -> list:
  """The engine with drafting far too dear (plain everywhere), Budget.hold 2 and `ahead`, three requests inserted
  (ignoring EOS): the list every later `choose` call appends to (its rows)."""
  calls = []
  real = engine_module.choose
  monkeypatch.setattr(engine_module, "choose", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=5.0))
  monkeypatch.setattr(engine, "budget", dataclasses.replace(AS_SET, ahead=ahead, hold=2))
  for p in PROMPTS[:3]:
    engine.insert(engine.free_slots()[0], p, RequestSettings(MAX_NEW, ignore_eos=True))
  return calls


def test_a_plain_choice_stands_for_the_next_plans(engine, refs, monkeypatch):
  """Budget.hold: a fresh plan that chose plain stands for the next `hold` plans over about the same rows (they call
  no `choose`); a drafting choice over several rows, another row, a forced step or hold=0 make the next plan fresh.
  Greedy output stays plain decoding's."""
  calls = _plain_held(engine, monkeypatch, ahead=0)
  fresh = 0
  for held in (False, True, True, False, True):  # fresh, held twice, fresh again, held
    key, limits = engine.plan_step()
    fresh += not held
    assert key[0] == 0 and not limits.any() and len(calls) == fresh
    engine.step(program=key, limits=limits)
  engine.step(program=key)  # a forced step (warmup's, a follower's) drops what stood
  engine.step()
  assert len(calls) == 3
  engine.free(engine.active_slots()[0])  # one of three rows replaced: a third new, more than a quarter
  engine.insert(engine.free_slots()[0], PROMPTS[3], RequestSettings(MAX_NEW, ignore_eos=True))
  engine.step()
  assert len(calls) == 4
  monkeypatch.setattr(engine, "budget", dataclasses.replace(AS_SET, ahead=0, hold=0))  # every plan fresh
  engine.step(program=key)
  for _ in range(3):
    engine.step()
  assert len(calls) == 7
  for slot in engine.active_slots():
    engine.free(slot)
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.02))  # drafting nearly free: it wins
  monkeypatch.setattr(engine, "budget", dataclasses.replace(AS_SET, ahead=0, hold=2))
  for p in PROMPTS[:3]:
    engine.insert(engine.free_slots()[0], p, RequestSettings(MAX_NEW, ignore_eos=True))
  assert engine.step().entry.gamma > 0 and len(calls) == 8
  engine.step()
  assert len(calls) == 9  # a drafting choice over three rows stands for nothing
  for slot in engine.active_slots():
    engine.free(slot)
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=5.0))
  engine.insert(engine.free_slots()[0], PROMPTS[0], RequestSettings(MAX_NEW, ignore_eos=True))
  calls.clear()
  for _ in range(3):  # a request alone: fresh, then held twice
    engine.step()
  assert len(calls) == 1
  engine.free(engine.active_slots()[0])
  engine.insert(engine.free_slots()[0], PROMPTS[1], RequestSettings(MAX_NEW, ignore_eos=True))
  engine.step()  # the next request alone is another row: fresh
  assert len(calls) == 2
  engine.free(engine.active_slots()[0])
  monkeypatch.setattr(engine, "budget", dataclasses.replace(engine.budget, hold=4))
  calls.clear()
  outputs = _serve_prompts(engine, refs)  # arriving one a step: the held plans run, and stay exact
  assert len(calls) < len(outputs)


def test_plain_chosen_ahead_stands_for_the_next_plans_too(engine, refs, monkeypatch):
  """Budget.ahead with Budget.hold: a plain tier chosen during a step (once a fresh plan's hold ran out) stands for
  the next `hold` plans as a fresh plan's does: over 7 steps of the same rows, the fresh plan, two held, a plan
  made ahead during the third step, two held, one ahead during the sixth: 3 choices (a plan ahead at every step
  after the first hold: 6). Greedy output stays plain decoding's."""
  calls = _plain_held(engine, monkeypatch, ahead=2)
  counts = []
  for _ in range(7):
    assert engine.step().entry.plain
    counts.append(len(calls))
  assert counts == [1, 1, 2, 2, 2, 3, 3], counts
  for slot in engine.active_slots():
    engine.free(slot)
  calls.clear()
  outputs = _serve_prompts(engine, refs)  # arriving one a step: the held plans run, and stay exact
  assert len(calls) < len(outputs)


def test_a_plan_made_ahead_stands_while_the_rows_are_about_the_same():
  ahead = Ahead(tier=1, requests=np.arange(8), rows=8)
  assert ahead.holds(np.arange(8), 8)
  assert ahead.holds(np.asarray([0, 1, 2, 3, 4, 5, 6, 9]), 8)  # one ended, another came
  assert ahead.holds(np.asarray([0, 1, 2, 3, 4, 5, 10, 11]), 8)  # two replaced: a quarter new, a quarter gone
  assert not ahead.holds(np.asarray([0, 1, 2, 3, 4, 10, 11, 12]), 8)  # three new
  assert not ahead.holds(np.asarray([0, 1, 2, 3, 4]), 8)  # three ended
  assert not ahead.holds(np.arange(8), 16)  # another row bucket: other costs
  assert not ahead.holds(np.asarray([0]), 8)
  assert Ahead(tier=0, requests=np.asarray([3]), rows=1).holds(np.asarray([3]), 1)
  assert not Ahead(tier=0, requests=np.asarray([3]), rows=1).holds(np.asarray([4]), 1)  # a request alone: all new
  assert Ahead(tier=0, requests=np.arange(4), rows=4).holds(np.asarray([0, 1, 2, 7]), 4)  # one of four replaced
  with pytest.raises(SettingsError, match="Budget.ahead"):
    Budget(ahead=-1)


def test_greedy_under_the_budget_equals_plain_and_uses_several_tiers(engine, refs, monkeypatch):
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.3))
  outputs = _serve_prompts(engine, refs)
  tiers = {o.entry.gamma for o in outputs if o.entry is not None}
  assert len(tiers) >= 2, tiers  # the estimates moved the choice
  for o in outputs:  # a slot's limit never exceeds its step's tier, and idle slots draft nothing
    if o.entry is not None:
      assert o.limits.max() <= o.entry.gamma and (o.drafted <= o.limits).all()


def test_host_estimates_equal_a_numpy_recomputation(engine, monkeypatch):
  """One iteration per step, greedy: beta is 1 for accepted positions and 0 at the first rejection, so each step's
  drafted / accepted counts give the estimates' update exactly, from the served requests' mean that the inserts
  wrote on the device (the module's engine has served requests before: it is not PRIOR_ALPHA)."""
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.3))
  prompts = PROMPTS[:3]
  g = engine.estimates().shape[1]
  prior = engine.acceptance.alpha.astype(np.float64)
  s = np.tile(est.PRIOR_COUNT * prior, (3, 1))
  c = np.full((3, g), est.PRIOR_COUNT)
  slots = []
  for p in prompts:
    slot = engine.free_slots()[0]
    assert not engine.insert(slot, p, RequestSettings(MAX_NEW)).finished
    slots.append(slot)
  np.testing.assert_allclose(engine.estimates()[slots], s / c)
  for _ in range(6):
    active = np.isin(slots, engine.active_slots())
    out = engine.step()
    drafted, accepted = out.drafted[slots], out.accepted[slots]
    beta = (np.arange(g)[None] < accepted[:, None]).astype(np.float64)
    s, c = _np_update(s, c, active, drafted, accepted, beta, prior)
    np.testing.assert_allclose(engine.estimates()[slots], s / c, rtol=1e-5)
  assert not np.allclose(s / c, prior)  # they moved
  for slot in engine.active_slots():
    engine.free(slot)


def test_plain_steps_relax_the_estimates_off_the_device_and_the_next_drafting_step_catches_up(engine):
  """A plain tier's step leaves the estimates out of its program (a plain engine's); its iterations verify
  nothing, so the host relaxes its copy by them and the next drafting step's program catches the device's copy
  up first (Estimates.relaxed). A drafting step, three plain ones and a drafting one give numpy's update
  iteration by iteration (one a step, greedy); the same without the plain steps' relaxation (the negative
  control: a device copy never caught up) reads otherwise after the last."""
  g = engine.estimates().shape[1]
  prior = engine.acceptance.alpha.astype(np.float64)
  start = (np.tile(est.PRIOR_COUNT * prior, (2, 1)), np.full((2, g), est.PRIOR_COUNT))
  slots = []
  for p in PROMPTS[:2]:
    slots.append(engine.free_slots()[0])
    assert not engine.insert(slots[-1], p, RequestSettings(MAX_NEW)).finished
  drafting, plain = (len(engine.table.entries) - 1, "greedy", 3), (0, "greedy", 3)
  programs = engine._programs  # pylint: disable=protected-access
  assert not programs[plain].estimates and programs[drafting].estimates
  every, skipped = start, start  # numpy's: every step's update; the drafting steps' alone
  for key in [drafting, plain, plain, plain, drafting]:
    active = np.isin(slots, engine.active_slots())
    out = engine.step(program=key)
    drafted, accepted = out.drafted[slots], out.accepted[slots]
    beta = (np.arange(g)[None] < accepted[:, None]).astype(np.float64)
    every = _np_update(*every, active, drafted, accepted, beta, prior)
    if key == drafting:
      skipped = _np_update(*skipped, active, drafted, accepted, beta, prior)
    np.testing.assert_allclose(engine.estimates()[slots], every[0] / every[1], rtol=1e-5)
    assert not np.allclose(every[0] / every[1], prior)  # off the prior, so that relaxing moves them
  assert not np.allclose(engine.estimates()[slots], skipped[0] / skipped[1], rtol=1e-4)
  for slot in engine.active_slots():
    engine.free(slot)


@pytest.fixture(scope="module")
def exact():
  """A draft equal to the target (every draft accepted) under the budget, 2 slots, not warmed up (tests set the
  costs); each test starts it at the fixed prior (no request served)."""
  e = SlotEngine(_llama(0), jaxspec.Speculation(_llama(0), gamma=3), slots=2, max_input_length=32,
                 max_new_tokens=MAX_NEW, iterations_per_step=1, modes=("greedy",), budget=AS_SET)
  return e


def test_a_draft_equal_to_the_target_takes_the_widest_tier(exact, refs):
  e = exact
  e.acceptance = AcceptancePrior.start(e.estimates().shape[1])
  e.costs = cost_curves(e, per_token=0.4)  # the prior (0.8) alone picks 2; every draft accepted moves it to 3
  outputs = []
  requests = [Request(PROMPTS[i], RequestSettings(MAX_NEW)) for i in (0, 2)]
  drive(e, requests, outputs=outputs)
  assert [r.tokens for r in requests] == [refs[0], refs[2]]
  ran = [o.entry.gamma for o in outputs if o.entry is not None]
  assert ran[0] == 2 and 3 in ran, ran  # (the last steps may be plain: the rows have a token or two left)
  assert all(o.accepted.sum() == o.drafted.sum() for o in outputs)
  # Requests of 2 tokens have 1 left after the insert: any tier gives it in one iteration, so the cheaper plain
  # step is chosen however well the draft does (the cap on each row's expected tokens; without it: 3).
  outputs = []
  requests = [Request(PROMPTS[i], RequestSettings(2)) for i in (0, 2)]
  drive(e, requests, outputs=outputs)
  assert [r.tokens for r in requests] == [refs[0][:2], refs[2][:2]]
  assert [o.entry.gamma for o in outputs if o.entry is not None] == [0]


def test_a_request_alone_holds_its_widest_tier_drafted_in_full(exact, refs, monkeypatch):
  """Budget.hold for a request alone whose fresh plan drafts the widest tier in full (every draft accepted, drafting
  nearly free): the next `hold` plans take that tier without a `choose`, each with the row's limit from its
  estimates then (prompts whose greedy decode runs to max_tokens). Negative controls: the same request with the
  widest tier dear (a narrower tier chosen), and two requests at once, call `choose` at every plan. Greedy output
  stays plain decoding's."""
  e = exact
  e.acceptance = AcceptancePrior.start(e.estimates().shape[1])
  calls = []
  real = engine_module.choose
  monkeypatch.setattr(engine_module, "choose", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
  monkeypatch.setattr(e, "budget", dataclasses.replace(AS_SET, ahead=0, hold=2))
  e.costs = cost_curves(e, per_token=0.01)
  slot = e.free_slots()[0]
  tokens = list(e.insert(slot, PROMPTS[2], RequestSettings(MAX_NEW)).tokens)
  plans = []
  while e.active_slots():
    key, limits = e.plan_step()
    plans.append((key[0], int(limits[slot]), len(calls)))
    tokens += e.step(program=key, limits=limits).tokens[slot]
  assert tokens == refs[2]
  # fresh, held twice (choose called once), fresh again: plain there, with a token left
  assert plans == [(3, 3, 1), (3, 3, 1), (3, 3, 1), (0, 0, 2)], plans
  calls.clear()
  e.costs = CostCurves({(r, k): c for r in e.row_buckets for k, c in zip((0, 1, 2, 3), (1.0, 1.01, 1.02, 9.0))})
  outputs = []
  requests = [Request(PROMPTS[2], RequestSettings(MAX_NEW))]
  drive(e, requests, outputs=outputs)
  assert requests[0].tokens == refs[2]
  ran = [o.entry.gamma for o in outputs]
  assert set(ran[:-1]) == {2} and len(calls) == len(outputs), ran  # a narrower tier: every plan (the last may be
  # plain, with a token left)
  calls.clear()
  e.costs = cost_curves(e, per_token=0.01)
  outputs = []
  requests = [Request(PROMPTS[i], RequestSettings(MAX_NEW)) for i in (2, 4)]
  drive(e, requests, outputs=outputs)
  assert [r.tokens for r in requests] == [refs[2], refs[4]]
  ran = [o.entry.gamma for o in outputs]
  assert set(ran[:-1]) == {3} and len(calls) == len(outputs), ran  # two rows: every plan


def test_a_new_request_starts_at_the_served_requests_acceptance(exact, refs):
  """At these costs the fixed prior (0.8 a position) scores plain above every tier, and a row whose drafts are all
  accepted scores the widest tier above plain once its estimates pass about 0.83. Requests that drafted (forced
  steps of the widest tier: every draft accepted) raise the served requests' acceptance, where a new request alone
  drafts from its first step; one decoded plain alone tells nothing and leaves it. Negative control: at the fixed
  prior (nothing learnt from the requests served) the same request begins plain."""
  e = exact
  g = e.estimates().shape[1]
  e.costs = CostCurves({(r, k): c for r in e.row_buckets for k, c in zip((0, 1, 2, 3), (1.0, 2.0, 2.6, 3.05))})
  widest, plain = (3, "greedy", e.row_buckets[0]), (0, "greedy", e.row_buckets[0])
  settings = RequestSettings(MAX_NEW, ignore_eos=True)

  def serve(prompt, program):  # one request alone, every step forced; its prior and last estimates (sum, count)
    slot = e.free_slots()[0]
    prior = e.acceptance.alpha.astype(np.float64)
    e.insert(slot, prompt, settings)
    while e.active_slots():
      e.step(program=program)
    return prior, jax.device_get((e._state.est_sum[slot], e._state.est_count[slot]))  # pylint: disable=protected-access

  def first_step(prior) -> int:  # the tier the budget picks for a new request alone at this prior
    e.acceptance = prior
    slot = e.free_slots()[0]
    e.insert(slot, PROMPTS[2], settings)
    np.testing.assert_allclose(e.estimates()[slot], prior.alpha)  # the host's copy and the device's row
    state = e._state  # pylint: disable=protected-access
    state = jax.device_get((state.est_sum[slot], state.est_count[slot], state.est_prior[slot]))
    np.testing.assert_allclose(state[0] / state[1], prior.alpha, rtol=1e-6)
    np.testing.assert_allclose(state[2], prior.alpha)  # where its unverified positions relax
    gamma = e.step().entry.gamma
    e.free(slot)
    return gamma

  assert first_step(AcceptancePrior.start(g)) == 0  # the negative control: a fixed prior begins plain
  e.acceptance = AcceptancePrior.start(g)
  pooled = np.zeros(g), np.zeros(g)
  for prompt in PROMPTS[:2]:
    prior, (beta_sum, count) = serve(prompt, widest)
    seen_sum, seen = est.observed(beta_sum.astype(np.float64), count.astype(np.float64), prior)
    np.testing.assert_allclose(seen_sum, seen, rtol=1e-4)  # every draft accepted: every verdict 1
    assert seen.min() > 1.0
    pooled = AcceptancePrior.DECAY * pooled[0] + seen_sum, AcceptancePrior.DECAY * pooled[1] + seen
    np.testing.assert_allclose(e.acceptance.beta_sum, pooled[0], rtol=1e-5)
    np.testing.assert_allclose(e.acceptance.count, pooled[1], rtol=1e-5)
  learnt = e.acceptance.alpha.copy()
  assert learnt.min() > 0.83
  serve(PROMPTS[3], plain)  # never drafted: its estimates tell nothing
  np.testing.assert_allclose(e.acceptance.alpha, learnt, rtol=1e-6)
  assert first_step(e.acceptance) == 3, learnt


def test_a_request_alone_drafts_first_where_the_served_requests_differ(exact, refs):
  """At these costs a request alone at the pool's acceptance (0.8 a position) is plain. When some of the last served
  requests drafted every token and the rest few (engine.acceptance.recent), one drafting step pays by the served
  requests (lookahead.py): a request alone that verified nothing drafts from its first step, exactly, and once it
  verified, its own estimates choose (every draft accepted: it drafts on). Negative controls: no served request,
  or served requests alike at the pool's acceptance, and it begins plain."""
  e = exact
  g = e.estimates().shape[1]
  e.costs = CostCurves({(r, k): c for r in e.row_buckets for k, c in zip((0, 1, 2, 3), (1.0, 2.0, 2.6, 3.05))})

  def served(recent):  # requests one at a time from a pool at 0.8 holding `recent`: their steps' draft lengths
    e.acceptance = AcceptancePrior.start(g)
    e.acceptance.recent = [(np.asarray(a, np.float64), n) for a, n in recent]
    outputs, requests = [], [Request(PROMPTS[i], RequestSettings(MAX_NEW)) for i in (0, 2)]
    for request in requests:
      drive(e, [request], outputs=outputs)
    assert [r.tokens for r in requests] == [refs[0], refs[2]]
    return [o.entry.gamma for o in outputs if o.entry is not None]

  assert served([])[0] == 0
  assert served([(np.full(g, 0.8), MAX_NEW)] * 8)[0] == 0
  ran = served([(np.ones(g), MAX_NEW)] * 4 + [(np.full(g, 0.3), MAX_NEW)] * 4)
  assert ran[0] > 0 and sum(k > 0 for k in ran) >= len(ran) - 2, ran


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ngram", "head", "tree"])
def test_other_drafters_under_the_budget_equal_plain_greedy(name, refs):
  if name == "tree":
    target, speculation = _llama(0), jaxspec.Speculation(_llama(0, mix=0.07), gamma=2,
                                                         tree=jaxspec.Tree(top_k=2, nodes=4))
  else:
    target, speculation = _case(name)
  e = SlotEngine(target, speculation, slots=3, max_input_length=32, max_new_tokens=MAX_NEW, iterations_per_step=2,
                 modes=("greedy",), row_buckets=(3,), budget=AS_SET)  # one bucket: the module engine has two
  assert [t.gamma for t in e.table.entries] == ([0, 2] if name == "tree" else [0, 1, 2, 3])
  e.costs = cost_curves(e, per_token=0.3)
  outputs = _serve_prompts(e, refs)
  assert any(o.entry is not None and o.entry.gamma > 0 for o in outputs)


def test_refusals_and_the_off_switch():
  target, speculation = _case("draft")
  kwargs = dict(slots=2, max_input_length=16, max_new_tokens=4)
  with pytest.raises(SettingsError, match="budget and table"):
    SlotEngine(target, speculation, table=SpeculationTable((TableEntry(2, gamma=1),)), budget=True, **kwargs)
  with pytest.raises(SettingsError, match="needs a speculation"):
    SlotEngine(target, None, budget=True, **kwargs)
  with pytest.raises(SettingsError, match="no drafting entry"):  # was a TypeError from deep inside (no allocation)
    SlotEngine(target, speculation, table=SpeculationTable((TableEntry(2, gamma=0),)), **kwargs)
  with pytest.raises(SettingsError, match="budget must be"):
    SlotEngine(target, speculation, budget="on", **kwargs)
  fixed = SlotEngine(target, speculation, budget=False, **kwargs)
  assert fixed.budget is None and [e.gamma for e in fixed.table.entries] == [3]
  # Off, no step program keeps the estimates (nothing of them updated or copied back); on, every drafting tier's
  # does and the plain tier's does not (its iterations only relax them: the host and the next drafting step
  # apply that at once).
  assert not any(p.estimates for p in fixed._programs.values())  # pylint: disable=protected-access
  on = SlotEngine(target, speculation, **kwargs)
  assert all(p.estimates != on.table.entries[k[0]].plain
             for k, p in on._programs.items())  # pylint: disable=protected-access
  assert SlotEngine(target, None, **kwargs).budget is None  # plain decoding: nothing to choose


# -- the choice made once, run anywhere (process 0 decides over several processes: hosts.py) ---------------------

class _Planned:
  """`engine` whose step is `step(program=, limits=)` of a plan: plan(engine) -> (key, limits)."""

  def __init__(self, engine, plan):
    self._engine, self._plan = engine, plan

  def __getattr__(self, name):
    return getattr(self._engine, name)

  def step(self):
    if not self._engine.active_slots():
      return self._engine.step()
    key, limits = self._plan(self._engine)
    return self._engine.step(program=key, limits=limits)


def _same_steps(a, b) -> None:
  """Two runs' StepOutputs (those that ran a program) are the same steps: program, limits, counts and tokens."""
  a, b = [o for o in a if o.entry is not None], [o for o in b if o.entry is not None]
  assert len(a) == len(b) and a
  for x, y in zip(a, b):
    assert (x.entry, x.mode, x.rows, x.tokens) == (y.entry, y.mode, y.rows, y.tokens)
    for field in ("limits", "drafted", "accepted", "iterations"):
      np.testing.assert_array_equal(getattr(x, field), getattr(y, field), err_msg=field)


def test_a_forced_plan_decodes_as_the_engines_own_choice(engine, refs, monkeypatch):
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.3))
  runs = []
  for driven in (engine, _Planned(engine, lambda e: e.plan_step())):
    monkeypatch.setattr(engine, "ends", EndRate())  # each run from the same end rate (the requests' EOS move it)
    monkeypatch.setattr(engine, "acceptance", AcceptancePrior.start(engine.estimates().shape[1]))  # and priors
    outputs = []
    requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS)]
    drive(driven, requests, outputs=outputs)
    assert [r.tokens for r in requests] == refs
    runs.append(outputs)
  _same_steps(*runs)
  assert len({o.entry.gamma for o in runs[0] if o.entry is not None}) >= 2  # the plans moved between tiers


def test_forced_limits_bound_each_slots_drafts_and_stay_exact(engine, refs):
  """The widest tier at every step with limits 0, 1 and 3 for slots 0, 1 and 2 (one iteration per step: a slot
  drafts at most its limit per step), whatever the engine would choose."""
  widest = len(engine.table.entries) - 1
  limits = np.array([0, 1, 3], np.int32)
  outputs = []
  requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS)]
  drive(_Planned(engine, lambda e: ((widest, "greedy", 3), limits)), requests, outputs=outputs)
  assert [r.tokens for r in requests] == refs
  ran = [o for o in outputs if o.entry is not None]
  assert all(o.entry.gamma == 3 and (o.limits == limits).all() and (o.drafted <= limits).all() for o in ran)
  assert max(o.drafted[2] for o in ran) == 3 and max(o.drafted[1] for o in ran) == 1


def test_bad_limits_are_one_settings_error(engine):
  with pytest.raises(SettingsError, match="no slot is active"):
    engine.plan_step()
  widest = (len(engine.table.entries) - 1, "greedy", 3)
  slot = engine.free_slots()[0]
  engine.insert(slot, PROMPTS[0], RequestSettings(MAX_NEW))
  try:
    key, limits = engine.plan_step()
    assert key in engine.programs and limits.shape == (3,) and limits[slot] <= engine.table.entries[key[0]].gamma
    with pytest.raises(SettingsError, match="pass program= too"):
      engine.step(limits=limits)
    for bad in ([0, 0], [0, 0, 4], [0, -1, 0], [0.5, 0, 0], [True, False, True], "003", [[0, 0, 0]]):
      with pytest.raises(SettingsError, match=r"limits must be 3 integers \(one per slot\) in \[0, 3\]"):
        engine.step(program=widest, limits=bad)
    with pytest.raises(SettingsError, match=r"in \[0, 0\]"):
      engine.step(program=(0, "greedy", 3), limits=[0, 1, 0])  # plain drafts nothing
    assert engine.active_slots() == [slot]  # nothing ran
  finally:
    engine.free(slot)
  target, speculation = _case("draft")
  fixed = SlotEngine(target, speculation, budget=False, slots=2, max_input_length=16, max_new_tokens=4)
  with pytest.raises(SettingsError, match="this engine has none"):
    fixed.step(program=fixed.programs[0], limits=[0, 0])


class _Store:
  """The distributed key-value store in a dict. A deleted call stays readable (recorded in `deleted`): the test's
  follower replays the calls after the leader made them all, where a real one reads each before the next step."""

  def __init__(self):
    self.values, self.deleted = {}, set()

  def key_value_set(self, key, value, allow_overwrite=False):  # pylint: disable=unused-argument
    self.values[key] = value

  def key_value_try_get(self, key):
    return self.values[key]

  def key_value_delete(self, key):
    self.deleted.add(key)

  def blocking_key_value_get(self, key, timeout_ms):  # pylint: disable=unused-argument
    if key not in self.values:
      raise RuntimeError(f"no {key}")  # not a timeout: a follower ends (SystemExit), a leader's stop goes on
    return self.values[key]

  def calls(self, name):
    """The keyword arguments of every published call `name`, in order."""
    prefix = hosts._PREFIX  # pylint: disable=protected-access
    numbers = sorted(int(k[len(prefix):]) for k in self.values if k[len(prefix):].isdigit())
    calls = [pickle.loads(base64.b64decode(self.values[f"{prefix}{n}"])) for n in numbers]
    return [kwargs for n, _, kwargs in calls if n == name]


def test_the_leader_publishes_its_choice_and_a_follower_runs_it(engine, refs, monkeypatch):
  """Process 0's engine (cost curves that make it draft) leads; the follower's own curves would run plain
  decoding everywhere (test_forced_costs_make_it_plain_everywhere), yet it runs the leader's tiers and limits."""
  store = _Store()
  monkeypatch.setattr(distributed.global_state, "client", store)
  monkeypatch.setattr(engine, "costs", cost_curves(engine, per_token=0.3))
  target, speculation = _case("draft")
  follower = SlotEngine(target, speculation, slots=3, max_input_length=32, max_new_tokens=MAX_NEW,
                        iterations_per_step=1, modes=("greedy",), row_buckets=(1, 3))
  follower.costs = cost_curves(follower, per_token=5.0)
  led, followed = [], []
  with monkeypatch.context() as m:  # a leader of two processes (its watch asks the store for process 1's beat)
    m.setattr(jax, "process_count", lambda: 2)
    leader = hosts.Leader(engine)
  try:
    requests = [Request(p, RequestSettings(MAX_NEW), arrive=i) for i, p in enumerate(PROMPTS)]
    drive(leader, requests, outputs=led)
    assert [r.tokens for r in requests] == refs
  finally:
    leader.stop("the test stopped")
  steps = store.calls("step")
  ran = [o for o in led if o.entry is not None]
  assert [(s["program"], s["limits"]) for s in steps] == [((engine.table.entries.index(o.entry), o.mode, o.rows),
                                                            o.limits.tolist()) for o in ran]
  assert any(o.entry.gamma > 0 for o in ran)
  real_step = follower.step
  monkeypatch.setattr(follower, "step", lambda **kwargs: followed.append(real_step(**kwargs)) or followed[-1])
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  assert hosts.follow(follower, poll_ms=10) == "the test stopped"
  _same_steps(led, followed)
  assert not follower.active_slots()
