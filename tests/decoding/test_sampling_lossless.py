"""Sampling is lossless: speculative outputs follow the target's exact (warped) distribution.

Every sample is one row of a large batch (rows draw independent randomness: the row index is folded into the
RNG). The exact distribution of whole output sequences is enumerated and compared with a chi-square test at
p ~ 3e-6; seeds are fixed, so the tests are deterministic. The joint distribution of several tokens is tested, so
that draft lengths chosen in later iterations (adaptive schedules, fallback, prompt lookup) matter.
`test_a_broken_rule_is_caught` shows that the same statistic rejects an implementation that draws the correction
token from p instead of the residual (with a draft model and with prompt lookup), and
`test_a_length_rule_that_peeks_at_the_verdict_is_caught` one whose draft lengths depend on the target's p.
"""


import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxspec.decoding.device import loop, sampling, schedules, tree_verify, verify
from jaxspec.decoding.drafters import ngram, tree
from jaxspec.decoding.device.drafter import PlainDrafter
from jaxspec.decoding.drafters.model_drafter import ModelDrafter
from jaxspec.decoding.settings import Tree
from jaxspec.models import t5

from stub_models import MarkovDecoder, chi_square, chi_square_limit, exact_sequence_probs, np_warp

VOCAB, LENGTH, EOS, START = 5, 3, 4, 0
# Samples per test. The limit (z = 4.5) keeps a correct rule's false-failure probability at ~3e-6 whatever the
# count; the count sets the power, the noncentrality lambda ~ rows * sum((p' - p)^2 / p) of a biased rule, whose
# statistic is ~ dof + lambda with standard deviation sqrt(2 (dof + 2 lambda)). Measured on the negative controls
# below: with a draft model, 2000 rows give the broken rule (and the length rule that peeks) 448 against the
# asserted 3 x limit = 134 (dof 10, sd ~ 42: 7 sd of margin), the broken tree rules 752 and 357 against 45; prompt
# lookup proposes one-hot q, whose bias is smaller, so its tests keep 4000 rows: the broken rule 610 against
# 3 x 77 = 232 (sd ~ 49: 7.7 sd), the broken lookup-tree rule 376 against 77 (sd ~ 38). Each count halved would
# take about half of each margin.
ROWS, LOOKUP_ROWS = 2000, 4000


@pytest.fixture(autouse=True)
def strict_ranks():
  """Rank promotion raises in these tests (the loop's and the stubs' code; the T5 test relaxes it for the model)."""
  with jax.numpy_rank_promotion("raise"):
    yield


def _markov_params(seed, scale=2.0):
  rng = np.random.RandomState(seed)
  return {"table": jnp.asarray(rng.randn(VOCAB, VOCAB) * scale, jnp.float32),
          "position_bias": jnp.asarray(rng.randn(16, VOCAB) * scale, jnp.float32)}


@functools.lru_cache(maxsize=None)
def _programs(settings, group):
  """The jitted prefill and loop of `settings` (vmapped over batches of `group` rows), one pair per settings and
  group shared by every test that samples with them: a later test neither traces nor lowers them again."""
  prefill, run = functools.partial(loop.prefill, settings), functools.partial(loop.run, settings)
  if group:
    prefill = jax.vmap(prefill, in_axes=(None, None, 0, 0))
    run = jax.vmap(run, in_axes=(None, None, 0, 0, 0, None, 0, 0, None))
  return jax.jit(prefill), jax.jit(run)


def _run(target_params, draft_params, gamma, temperature=1.0, top_k=0, top_p=1.0, seed=0, rows=None,
         decoder=MarkovDecoder(), drafter=None, input_ids=None, schedule="constant", spec=None, group=None,
         tree=None, fresh=False):
  """Samples `rows` outputs (default: ROWS, or one per row of input_ids): one batch, or with `group`,
  rows // group batches of `group` rows decoded side by side (vmapped), so that batch-wide decisions (fallback, the
  adaptive length) are taken by small batches. drafter: None drafts with `decoder` (a model drafter of the target's
  kind) when gamma > 0. fresh: trace the programs anew and keep them for no other test (tests that monkeypatch the
  loop's functions)."""
  if drafter is None:
    drafter = ModelDrafter(decoder) if gamma else PlainDrafter()
  settings = loop.LoopSettings(target=decoder, drafter=drafter, gamma=gamma,
                               max_new_tokens=LENGTH, greedy=False, filtering=top_k > 0 or top_p < 1,
                               eos_ids=(EOS,), pad_id=0, schedule=schedule, tree=tree)
  if rows is None:
    rows = ROWS if input_ids is None else input_ids.shape[0]
  ids = jnp.ones((rows, 4), jnp.int32) if input_ids is None else input_ids
  input_lengths = jnp.full((ids.shape[0],), ids.shape[1], jnp.int32)
  # One seed for the batch, the row index folded in: every row draws independently.
  seeds, row_ids = np.full((rows,), seed, np.uint32), np.arange(rows, dtype=np.int32)
  if group:
    ids, input_lengths, seeds, row_ids = (x.reshape((rows // group, group) + x.shape[1:])
                                          for x in (ids, input_lengths, seeds, row_ids))
  prefill, run = (_programs.__wrapped__ if fresh else _programs)(settings, group)
  tc, dc, first = prefill(target_params, draft_params, ids, input_lengths)
  state = run(target_params, draft_params, tc, dc, first, sampling.SamplingKnobs.create(temperature, top_k, top_p),
              seeds, row_ids, spec)
  seqs, lengths = jax.device_get((state.sequences, state.lengths))
  seqs, lengths = seqs.reshape(rows, -1), lengths.reshape(rows)
  return [tuple(s[1:n]) for s, n in zip(seqs, lengths)], state


def _markov_exact(params, temperature=1.0, top_k=0, top_p=1.0):
  table, pos = np.asarray(params["table"]), np.asarray(params["position_bias"])
  return exact_sequence_probs(lambda prefix: np_warp(table[prefix[-1]] + pos[len(prefix) - 1], temperature, top_k,
                                                     top_p), VOCAB, LENGTH, EOS, START)


def _assert_matches(samples, exact):
  stat, dof = chi_square(samples, exact)
  assert stat < chi_square_limit(dof), (stat, dof)


def _one_hot_draft(seed):
  p = _markov_params(seed, scale=30.0)  # logits 30 apart: q is one-hot to float32 precision
  return p


CASES = {
    "p_equals_q": lambda: (_markov_params(0), _markov_params(0)),
    "random_p_and_q": lambda: (_markov_params(0), _markov_params(1)),
    "disjoint_supports": lambda: (
        {"table": jnp.where(jnp.arange(VOCAB) % 2 == 0, 0.0, -jnp.inf)[None] * jnp.ones((VOCAB, 1)),
         "position_bias": jnp.zeros((16, VOCAB))},
        {"table": jnp.where(jnp.arange(VOCAB) % 2 == 1, 0.0, -jnp.inf)[None] * jnp.ones((VOCAB, 1)),
         "position_bias": jnp.zeros((16, VOCAB))}),
    "one_hot_q": lambda: (_markov_params(0), _one_hot_draft(3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("gamma", [1, 3])
def test_lossless_on_known_distributions(case, gamma):
  target, draft = CASES[case]()
  samples, state = _run(target, draft, gamma)
  _assert_matches(samples, _markov_exact(target))
  alpha = float(state.stats.beta_sum.sum() / state.stats.beta_count.sum())
  if case == "p_equals_q":
    assert alpha == pytest.approx(1.0, abs=1e-5)
  if case == "disjoint_supports":
    assert alpha == 0.0 and int(state.stats.accepted.sum()) == 0


@pytest.mark.parametrize("top_k,top_p", [(2, 1.0), (0, 0.6), (3, 0.7)])
def test_lossless_with_top_k_and_top_p(top_k, top_p):
  target, draft = _markov_params(0), _markov_params(1)
  samples, _ = _run(target, draft, gamma=2, temperature=0.7, top_k=top_k, top_p=top_p)
  _assert_matches(samples, _markov_exact(target, 0.7, top_k, top_p))


# Every knob on: rows stop after unconfident drafts; batches start at fallback_alpha (prior_alpha), draft, rest
# when their rows' mean estimate falls below it and probe every other iteration (LENGTH is only 3 tokens).
ADAPTIVE_KNOBS = schedules.SpeculationKnobs.create(draft_confidence=0.5, fallback_alpha=0.6, probe_interval=1,
                                                  draft_cost=0.1, prior_alpha=0.6)


@pytest.mark.parametrize("schedule,gamma,group", [("heuristic", 2, 1), ("adaptive", 3, 2)])
def test_lossless_with_adaptive_schedules(schedule, gamma, group):
  """Batches of 1 and of 2 rows: in the latter, a row's draft length and resting also follow its neighbour's past.
  Each schedule and each batch size once (each case compiles a loop of its own)."""
  target, draft = _markov_params(0), _markov_params(1)
  samples, state = _run(target, draft, gamma, schedule=schedule, spec=ADAPTIVE_KNOBS, group=group)
  _assert_matches(samples, _markov_exact(target))
  stats = jax.device_get(state.stats)
  lengths = np.asarray(stats.draft_lengths).reshape(-1, gamma + 1).sum(0)  # [G + 1] iterations per length drafted
  assert lengths[0] > 0 and np.count_nonzero(lengths[1:]) >= 2  # rests, and several lengths drafted
  rested, drafted = np.asarray(stats.fallback_iterations) > 0, np.asarray(stats.drafted) > 0
  assert np.sum(rested & drafted) > ROWS // 10 and int(np.sum(stats.accepted)) > 0  # rows switched between both


def _lookup_inputs(kind: str, rows=LOOKUP_ROWS, width=6):
  """Inputs over the stub's vocabulary: "random" per row (the lookup proposes different tokens in different rows)
  or "fixed" (every row the same: a proposal is a function of the output so far)."""
  if kind == "fixed":
    return jnp.tile(jnp.asarray([[3, 1, 0, 2, 3, 0]], jnp.int32), (rows, 1))
  return jnp.asarray(np.random.RandomState(0).randint(0, VOCAB, size=(rows, width)), jnp.int32)


@pytest.mark.parametrize("schedule", ["constant", "adaptive"])
@pytest.mark.parametrize("gamma,inputs", [(1, "random"), (3, "fixed")])
def test_lossless_with_ngram_draft(schedule, gamma, inputs):
  """Prompt lookup: q is one-hot on each proposal (accepted with probability p(x), residual p without x)."""
  target = _markov_params(0, scale=1.0)
  samples, state = _run(target, None, gamma, drafter=ngram.NGramDrafter(max_ngram=2),
                        input_ids=_lookup_inputs(inputs), schedule=schedule,
                        spec=ADAPTIVE_KNOBS if schedule != "constant" else None)
  _assert_matches(samples, _markov_exact(target))
  accepted, drafted = int(state.stats.accepted.sum()), int(state.stats.drafted.sum())
  assert 0 < accepted < drafted  # proposals were used, and some were rejected


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_a_broken_rule_is_caught(monkeypatch, drafter):
  """Drawing the correction token from p instead of norm(max(0, p - q)) must fail the same test."""
  if drafter == "model":
    target, draft, kw = _markov_params(0), _markov_params(1), {}
  else:
    target, draft = _markov_params(0, scale=1.0), None
    # Fixed inputs: with proposals spread evenly over the vocabulary (random inputs), drawing from p after
    # rejecting a one-hot proposal happens to leave the marginal unbiased.
    kw = dict(drafter=ngram.NGramDrafter(max_ngram=2), input_ids=_lookup_inputs("fixed"))
  exact = _markov_exact(target)
  jax.clear_caches()
  monkeypatch.setattr(verify, "residual_probs", lambda p, q: p)
  try:
    samples, _ = _run(target, draft, gamma=3, fresh=True, **kw)
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  stat, dof = chi_square(samples, exact)
  assert stat > 3 * chi_square_limit(dof), (stat, dof)


def test_a_length_rule_that_peeks_at_the_verdict_is_caught(monkeypatch):
  """Choosing a row's draft length after the target's verdict breaks exactness, and the same test rejects it:
  here each row's draft is cut to the prefix the target accepts, so the token after it comes from p instead of
  the residual. Lengths may depend only on the past and on the draft's own probabilities."""
  target, draft = _markov_params(0), _markov_params(1)
  exact = _markov_exact(target)
  honest = verify.accept_sampled

  def peeking(key, draft_tokens, q, p, num_drafted=None):
    verdict = honest(key, draft_tokens, q, p, num_drafted)
    return honest(key, draft_tokens, q, p, verdict.num_accepted)  # the same draws: all of the cut draft accepted

  jax.clear_caches()
  monkeypatch.setattr(verify, "accept_sampled", peeking)
  try:
    samples, _ = _run(target, draft, gamma=3, schedule="heuristic",
                      spec=schedules.SpeculationKnobs.create(draft_confidence=0.5), fresh=True)
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  stat, dof = chi_square(samples, exact)
  assert stat > 3 * chi_square_limit(dof), (stat, dof)


def test_plain_sampling_matches_the_target():
  target = _markov_params(5)
  samples, _ = _run(target, None, gamma=0)
  _assert_matches(samples, _markov_exact(target))


def test_warp_matches_transformers_processors():
  from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                      TopPLogitsWarper)
  logits = np.random.RandomState(0).randn(6, 50).astype(np.float32) * 3
  for temperature, top_k, top_p in [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8), (0.5, 10, 0.5), (1.0, 1, 1.0)]:
    scores = torch.tensor(logits)
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
      scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
      scores = TopPLogitsWarper(top_p)(None, scores)
    want = torch.softmax(scores, -1).numpy()
    got = np.asarray(sampling.warp_probs(jnp.asarray(logits), sampling.SamplingKnobs.create(temperature, top_k, top_p),
                                         filtering=top_k > 0 or top_p < 1))
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_residual_falls_back_to_p_without_mass():
  p = jnp.asarray([[0.25, 0.25, 0.5]])
  np.testing.assert_allclose(verify.residual_probs(p, p), p)
  np.testing.assert_allclose(verify.residual_probs(p, jnp.asarray([[0.5, 0.25, 0.25]])), [[0.0, 0.0, 1.0]])


def test_lossless_with_real_tiny_t5_pair():
  """A tiny random T5 target and a different tiny T5 draft; exact target probabilities by teacher forcing."""
  tcfg = t5.T5Config(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=2,
                     num_heads=2, activation="gelu_new", gated=True, tie_word_embeddings=False,
                     scale_decoder_outputs=False, eos_token_id=EOS)
  dcfg = t5.T5Config(vocab_size=VOCAB, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_decoder_layers=1,
                     num_heads=2, eos_token_id=EOS)
  init = jax.jit(t5.init_params, static_argnums=0)  # one program per config, not one per parameter shape
  tparams, dparams = init(tcfg, jax.random.key(0)), init(dcfg, jax.random.key(1))
  prompt = jnp.asarray([[2, 3, 1]], jnp.int32)
  temperature = 0.8

  with jax.numpy_rank_promotion("allow"):  # the T5 model's code is not rank-strict
    # Every decoder prefix's next-token logits from one teacher-forced pass (the decoder is causal): START then each
    # of the (VOCAB - 1)^(LENGTH - 1) continuations without EOS; position k holds those of the prefix of k + 1.
    tokens = [t for t in range(VOCAB) if t != EOS]
    rows = np.asarray([(START,) + c for c in itertools.product(tokens, repeat=LENGTH - 1)], np.int32)
    logits = np.asarray(jax.jit(t5.forward, static_argnums=1)(tparams, tcfg, jnp.tile(prompt, (len(rows), 1)),
                                                              jnp.asarray(rows)))
    prefix_logits = {tuple(row[:k + 1]): row_logits[k] for row, row_logits in zip(rows, logits) for k in range(LENGTH)}
    exact = exact_sequence_probs(lambda prefix: np_warp(prefix_logits[tuple(prefix)], temperature), VOCAB, LENGTH,
                                 EOS, START)
    samples, state = _run(tparams, dparams, gamma=2, temperature=temperature, decoder=t5.T5Decoder(tcfg),
                          drafter=ModelDrafter(t5.T5Decoder(dcfg)), input_ids=jnp.tile(prompt, (ROWS, 1)))
  _assert_matches(samples, exact)
  assert int(state.stats.accepted.sum()) > 0  # the draft's tokens were really used


@pytest.mark.parametrize("vocab", [5, 300])
def test_sample_draws_each_token_with_its_probability(vocab):
  """The two-level inverse-CDF sampler across block boundaries, with zero-probability tokens in every block."""
  rng = np.random.default_rng(vocab)
  probs = rng.dirichlet(np.full(vocab, 0.3)) * (rng.random(vocab) < 0.6)
  probs[rng.integers(vocab)] += 0.05  # at least one token with mass
  probs = probs / probs.sum()
  rows = 4  # several rows drawn at once must each follow the distribution
  # Draws n = keys * rows: a bug that moves one token's mass p to another of similar mass adds ~ 2 n p to the
  # statistic. Vocabulary 300 (179 tokens with mass; 147 dof, limit 237 at n = 200k): the median token's p ~ 1.2e-3
  # adds ~ 480 (sd ~ 47: 8 sd past the limit), so it keeps 200k draws; vocabulary 5 (3 tokens with mass, 2 dof,
  # limit 27): a token of p >= 0.06 adds >= 6000 at n = 50k.
  keys = 50_000 if vocab > 5 else 12_500
  draws = jax.jit(jax.vmap(lambda k: sampling.sample(k, jnp.tile(jnp.asarray(probs, jnp.float32), (rows, 1)))))(
      jax.random.split(jax.random.key(3), keys))
  draws = np.asarray(draws).reshape(-1)
  assert probs[draws].min() > 0  # never a token without mass
  _assert_matches([(int(t),) for t in draws], {(i,): float(p) for i, p in enumerate(probs) if p > 0})


@pytest.mark.parametrize("case,tree", [("random_p_and_q", Tree(top_k=2, nodes=4)),
                                       ("one_hot_q", Tree(top_k=3, nodes=5))])
def test_lossless_with_trees(case, tree):
  """Token trees from a draft model (depth 2: the joint distribution of 3 tokens spans two iterations)."""
  target, draft = CASES[case]()
  samples, state = _run(target, draft, gamma=2, tree=tree)
  _assert_matches(samples, _markov_exact(target))
  assert int(state.stats.accepted.sum()) > 0


def test_sampled_children_accept_more_than_deterministic_ones(monkeypatch):
  """Children drawn from q and verified by recursive rejection sampling accept a draw with probability
  min(1, p / q); the deterministic-candidate rule (q's top k, each accepted with probability p(x)) accepts less
  when q is close to p (a draft far from the target can do better with its top k). Same pair, tree and rows;
  when p == q the first draw at every node is always accepted: every iteration accepts its whole
  depth (bar EOS). ROWS rows: the honest runs reuse test_lossless_with_trees's compiled programs."""
  target, other = _markov_params(0, scale=0.7), _markov_params(1, scale=0.7)  # broad p, as at temperature 1
  draft = jax.tree.map(lambda t, o: t + 0.3 * o, target, other)  # a draft close to the target, as trained ones are
  _, drawn = _run(target, draft, gamma=2, tree=Tree(top_k=2, nodes=4))
  _, same = _run(target, target, gamma=2, tree=Tree(top_k=2, nodes=4))
  top_k = tree._children  # the deterministic rule's tree: q's top k, each sibling accepted with p(x)
  monkeypatch.setattr(tree, "_children", lambda logprobs, k, keys: top_k(logprobs, k, None))
  monkeypatch.setattr(loop.tree_verify, "accept_tree_recursive",
                      lambda key, tokens, parents, p, siblings, path_size: tree_verify.accept_tree_sampled(
                          key, tokens, parents, p, path_size))
  _, deterministic = _run(target, draft, gamma=2, tree=Tree(top_k=2, nodes=4), fresh=True)
  rate = lambda state: float(state.stats.accepted.sum() / state.stats.iterations.sum())
  print("accepted per iteration: drawn", rate(drawn), "deterministic", rate(deterministic), "p == q", rate(same))
  assert rate(drawn) > 1.1 * rate(deterministic), (rate(drawn), rate(deterministic))
  full = same.stats.accepted_per_position  # [B, G]: accepted count per depth
  assert np.all(np.asarray(full[:, 0]) >= np.asarray(same.stats.iterations) - 1), "p == q: depth 1 always accepted"


def test_lossless_with_trees_top_k_and_top_p():
  target, draft = _markov_params(0), _markov_params(1)
  samples, _ = _run(target, draft, gamma=2, temperature=0.7, top_k=3, top_p=0.7, tree=Tree(top_k=2, nodes=4))
  _assert_matches(samples, _markov_exact(target, 0.7, 3, 0.7))


@pytest.mark.parametrize("drafter", ["model", "model_top_k", "ngram"])
def test_a_broken_tree_rule_is_caught(monkeypatch, drafter):
  """Negative controls: the same statistic rejects, for trees from a draft model (children drawn from q,
  recursive rejection sampling), a rule whose residual after a rejected draw is r itself (not max(0, r - q));
  children taken as q's top k but accepted with min(1, p / q) (EAGLE's temperature > 0 rule: the draws must come
  from q); and, for prompt lookup (deterministic candidates), a next token drawn from p itself (not the residual
  without the rejected siblings)."""
  if drafter == "model":
    monkeypatch.setattr(tree_verify, "residual_probs", lambda r, q: r)
  elif drafter == "model_top_k":
    top_k = tree._children
    monkeypatch.setattr(tree, "_children", lambda logprobs, k, keys: top_k(logprobs, k, None))
  else:
    monkeypatch.setattr(tree_verify, "_residual", lambda p_node, tokens, rejected: p_node)
  if drafter.startswith("model"):
    target = _markov_params(0)
    samples, _ = _run(target, _markov_params(1), gamma=2, tree=Tree(top_k=2, nodes=4), fresh=True)
  else:
    target = _markov_params(0, scale=1.0)
    samples, _ = _run(target, None, 2, drafter=ngram.NGramDrafter(max_ngram=2), input_ids=_lookup_inputs("fixed"),
                      tree=Tree(top_k=3, nodes=6), fresh=True)  # fixed inputs: see test_a_broken_rule_is_caught
  stat, dof = chi_square(samples, _markov_exact(target))
  assert stat > chi_square_limit(dof), (stat, dof)


@pytest.mark.parametrize("inputs", ["random", "fixed"])
def test_lossless_with_lookup_trees(inputs):
  """Prompt-lookup trees: several earlier matches become branches (deterministic candidates)."""
  target = _markov_params(0, scale=1.0)
  samples, state = _run(target, None, 2, drafter=ngram.NGramDrafter(max_ngram=2), input_ids=_lookup_inputs(inputs),
                        tree=Tree(top_k=3, nodes=6))
  _assert_matches(samples, _markov_exact(target))
  assert 0 < int(state.stats.accepted.sum())
