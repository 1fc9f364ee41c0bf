"""A request alone that has verified nothing: the first drafting step that the served requests say pays
(jaxspec/serving/lookahead.py), without an engine: the rule on made-up served requests and step costs."""

from __future__ import annotations

import numpy as np

from jaxspec.serving.budget import AcceptancePrior, choose
from jaxspec.serving.lookahead import drafts_first

G, TIERS, COSTS, ITERATIONS, THETA = 4, (0, 1, 2, 4), (1.0, 1.8, 2.1, 2.6), 4, 0.2


def _requests(*groups):
  """[(a_r [G], tokens_r)] from (count, acceptance, tokens) groups."""
  return [(np.full(G, a), n) for count, a, n in groups for _ in range(count)]


def _plain_choice(alpha: float):
  """The budget's choice for a request alone at the pooled acceptance `alpha` (plain at these costs)."""
  choice = choose(np.full((1, G), alpha), TIERS, COSTS, THETA, left=np.array([60]), iterations=ITERATIONS)
  assert choice.k == 0 and choice.other is not None and choice.other.k > 0
  return choice


def _drafts(recent, given=1, left=60, alpha=0.5, **kw) -> bool:
  return drafts_first(recent, _plain_choice(alpha).other, TIERS, COSTS, THETA, ITERATIONS, given, left, **kw)


def test_requests_that_differ_make_a_first_drafting_step_pay_where_the_mean_says_plain():
  # A quarter long and well drafted (the embedded pair's 63-token outputs), the rest short and poorly drafted:
  # at their mean plain wins the step, but drafting one step shows which kind a request is.
  mixed = _requests((4, 0.95, 63), (12, 0.4, 10))
  assert _drafts(mixed)
  # Negative controls: requests alike, poorly drafted, or alike at the mean of the mixed ones: plain.
  assert not _drafts(_requests((16, 0.4, 10)))
  assert not _drafts(_requests((16, 0.5, 24)))


def test_a_request_that_gave_many_tokens_counts_only_the_requests_longer_than_it():
  # Most requests middling in length and well drafted, a few long and poorly drafted: at its start a request is
  # most likely one of the first (drafting pays), after 30 tokens it is one of the long ones (plain); with a known
  # length (ignore_eos) every request counts.
  recent = _requests((12, 0.95, 24), (4, 0.3, 60))
  assert _drafts(recent, given=1)
  assert not _drafts(recent, given=30)
  assert _drafts(_requests((8, 0.95, 8)), given=12, known_length=True)
  assert not _drafts(_requests((8, 0.95, 8)), given=12)  # none of them is as long: no evidence, the choice stands


def test_the_stick_holds_plain_after_a_plain_step_unless_drafting_pays_clearly():
  recent = _requests((3, 0.95, 63), (13, 0.4, 10))
  assert _drafts(recent)
  assert not _drafts(recent, stick=5.0)


def test_nothing_to_weigh_keeps_the_choice():
  assert not _drafts([])
  assert not drafts_first(_requests((4, 0.95, 63)), None, TIERS, COSTS, THETA, ITERATIONS, 1, 60)
  assert not _drafts(_requests((4, 0.95, 63)), left=0)


def test_the_pool_keeps_the_last_requests_that_drafted_and_ran_to_their_end():
  pool = AcceptancePrior.start(G)
  prior = np.full(G, 0.8)
  verdicts = 4.0  # per position: a request's estimates after verdicts of 1 on its prior's weight of 8
  drafted = (8 * prior + verdicts, np.full(G, 8.0 * 0.9 ** 4 + sum(0.9 ** i for i in range(4))))
  for tokens in range(AcceptancePrior.RECENT + 3):
    pool.observe(*drafted, prior, tokens)
  assert [n for _, n in pool.recent] == list(range(3, AcceptancePrior.RECENT + 3))
  np.testing.assert_allclose(pool.recent[-1][0], np.clip(drafted[0] / drafted[1], 0, 1))
  pool.observe(*drafted, prior, None)  # freed, cut short: its length says nothing
  pool.observe(8 * prior, np.full(G, 8.0), prior, 5)  # never drafted: nothing of it
  assert len(pool.recent) == AcceptancePrior.RECENT and pool.recent[-1][1] == AcceptancePrior.RECENT + 2
