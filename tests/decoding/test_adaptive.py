"""Variable draft lengths (schedule="heuristic" / "adaptive", draft_confidence, fallback_alpha): greedy exactness,
the verification mask, the schedules' rules, the draft cache's catch-up, stats, compilation and argument checks.
Lossless sampling under these schedules is in test_sampling_lossless.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.device import loop, sampling, schedules, verify
from jaxspec.decoding import arguments, placement, theory
from jaxspec.decoding.drafters import model_drafter
from jaxspec.decoding.drafters.model_drafter import ModelDrafter
from jaxspec.models import t5



@pytest.fixture
def strict_ranks():
  """Rank promotion raises inside the test (the decoding code's own functions; the T5 model's are not strict)."""
  with jax.numpy_rank_promotion("raise"):
    yield

MAX_NEW = 17
EOS = 1
# Every knob on; fallback_alpha between the two drafts' acceptance, so rows rest and probe.
KNOBS = dict(draft_confidence=0.2, fallback_alpha=0.55, probe_interval=2)


def _keys_like(tree, seed):
  leaves, treedef = jax.tree.flatten(tree)
  return jax.tree.unflatten(treedef, list(jax.random.split(jax.random.key(seed), len(leaves))))


def _noisy(model, scale, seed):
  params = jax.tree.map(lambda x, k: x + scale * jnp.std(x) * jax.random.normal(k, x.shape), model.params,
                        _keys_like(model.params, seed))
  return jaxspec.Model(model.config, params, name=f"noisy{scale}")


@pytest.fixture(scope="module")
def pair():
  """A tiny T5 target, a noisy copy of it (often accepted) and a noisier one (often rejected)."""
  cfg = t5.T5Config(vocab_size=40, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                    activation="gelu_new", gated=True, tie_word_embeddings=False, scale_decoder_outputs=False,
                    eos_token_id=EOS)
  target = jaxspec.Model(cfg, t5.init_params(cfg, jax.random.key(0)), name="target")
  return target, _noisy(target, 0.2, 1), _noisy(target, 0.9, 2)


def _prompts(seed=0, sizes=(4, 11, 1, 7, 15, 3)):
  rng = np.random.RandomState(seed)
  return [list(rng.randint(2, 40, size=n)) + [EOS] for n in sizes]


def _with_eos(model, eos):
  return dataclasses.replace(model, config=dataclasses.replace(model.config, eos_token_id=eos))


def _ragged_eos(tokens):
  """A token whose first occurrence differs between rows (not at the start): as EOS it ends rows raggedly."""
  best, spread = None, -1
  for tok in range(2, int(tokens.max()) + 1):
    first = [int(np.argmax(row == tok)) if (row == tok).any() else len(row) for row in tokens]
    if min(first) >= 2 and len(set(first)) > spread:
      best, spread = tok, len(set(first))
  return best


# --- verification with per-row draft lengths ------------------------------------------------------------------


@pytest.mark.usefixtures("strict_ranks")
def test_greedy_verdict_never_accepts_undrafted_positions():
  vocab = 6
  best = np.array([[2, 3, 4, 5], [2, 3, 4, 5], [2, 3, 4, 5], [1, 1, 1, 1]])  # the target's argmax per position
  logits = jnp.asarray(np.eye(vocab)[best] * 5.0, jnp.float32)  # [B, G + 1, V]
  drafts = jnp.asarray([[2, 3, 4], [2, 3, 4], [2, 0, 4], [1, 1, 1]], jnp.int32)  # all match but row 2's x_2
  counts = jnp.asarray([3, 1, 3, 0], jnp.int32)
  v = verify.accept_greedy(drafts, logits, counts)
  assert v.num_accepted.tolist() == [3, 1, 1, 0]
  assert v.next_token.tolist() == [5, 3, 3, 1]  # the argmax after the kept prefix: p at k when all k are kept
  np.testing.assert_array_equal(np.asarray(v.beta), [[1, 1, 1], [1, 0, 0], [1, 0, 1], [0, 0, 0]])


@pytest.mark.usefixtures("strict_ranks")
def test_sampled_verdict_masks_positions_and_draws_from_p_after_k():
  """Drafts equal to a one-hot target are always accepted where drafted; after k accepted drafts the next token
  comes from p at position k, not from a residual (which would exclude the target's only token)."""
  vocab, gamma, batch = 5, 3, 64
  target_tokens = np.array([2, 3, 4, 1])
  p = jnp.asarray(np.tile(np.eye(vocab)[target_tokens], (batch, 1, 1)), jnp.float32)  # [B, G + 1, V] one-hot
  drafts = jnp.asarray(np.tile(target_tokens[:gamma], (batch, 1)), jnp.int32)
  q = jnp.asarray(np.tile(np.eye(vocab)[target_tokens[:gamma]] * 0.5 + 0.1, (batch, 1, 1)), jnp.float32)
  counts = jnp.asarray(np.arange(batch) % (gamma + 1), jnp.int32)
  keys = jax.random.split(jax.random.key(0), batch)
  for qq in (q, None):
    v = verify.accept_sampled(keys, drafts, qq, p, counts)
    np.testing.assert_array_equal(v.num_accepted, counts)
    np.testing.assert_array_equal(v.next_token, target_tokens[np.asarray(counts)])
    assert np.all(np.asarray(v.beta)[np.arange(gamma)[None] >= np.asarray(counts)[:, None]] == 0)


@pytest.mark.usefixtures("strict_ranks")
def test_sampled_verdict_without_counts_is_unchanged():
  """num_drafted=None and num_drafted=gamma give the same verdict (schedule 'constant' keeps its code path)."""
  rng = np.random.RandomState(0)
  batch, gamma, vocab = 32, 3, 7
  p = jax.nn.softmax(jnp.asarray(rng.randn(batch, gamma + 1, vocab), jnp.float32))
  q = jax.nn.softmax(jnp.asarray(rng.randn(batch, gamma, vocab), jnp.float32))
  drafts = jnp.asarray(rng.randint(0, vocab, size=(batch, gamma)), jnp.int32)
  keys = jax.random.split(jax.random.key(1), batch)
  a = verify.accept_sampled(keys, drafts, q, p)
  b = verify.accept_sampled(keys, drafts, q, p, jnp.full((batch,), gamma, jnp.int32))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


# --- the schedules' rules ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("strict_ranks")
def test_adaptive_length_maximises_theorem_3_8():
  gamma = 8
  alphas = np.linspace(0.0, 1.0, 21)
  for c in (0.0, 0.02, 0.1, 0.5):
    got = np.asarray(schedules.theory_length(jnp.asarray(alphas, jnp.float32), jnp.float32(c), gamma))
    for alpha, k in zip(alphas, got):
      best = max(theory.expected_speedup(float(alpha), g, c) for g in range(1, gamma + 1))  # speculating at all
      assert 1 <= k <= gamma
      assert theory.expected_speedup(float(alpha), int(k), c) == pytest.approx(best, rel=1e-5), (alpha, c, k)
  assert np.asarray(schedules.theory_length(jnp.asarray([0.0, 0.95]), jnp.float32(0.05), gamma)).tolist() == [1, 8]


@pytest.mark.usefixtures("strict_ranks")
def test_heuristic_rule_and_fallback_counters():
  gamma = 5
  state = schedules.ScheduleState.create(4, gamma).replace(length=jnp.asarray([5, 3, 1, 2], jnp.int32))
  drafted = jnp.asarray([5, 3, 1, 0], jnp.int32)
  accepted = jnp.asarray([5, 1, 0, 0], jnp.int32)
  beta = jnp.ones((4, gamma), jnp.float32)
  resting = jnp.asarray([False, False, False, True])
  new = schedules.update(state, gamma, drafted, accepted, beta, resting, jnp.ones((4,), bool))
  assert new.length.tolist() == [5, 2, 1, 2]  # +2 clipped to gamma, -1, -1 clipped to 1, unchanged (no draft)
  assert new.idle.tolist() == [0, 0, 0, 1]
  # Verified positions: 5 (all accepted), 2 (up to the first rejection), 1, 0 (nothing drafted: no evidence).
  prior = schedules.PRIOR_POSITIONS * schedules.ALPHA_DECAY ** np.asarray([5, 2, 1, 0])
  np.testing.assert_allclose(new.beta_count, prior + [5, 2, 1, 0], rtol=1e-6)
  one = jnp.ones((1,), bool)
  missed = schedules.update(schedules.ScheduleState.create(1, gamma), gamma, jnp.asarray([3], jnp.int32),
                           jnp.asarray([0], jnp.int32), jnp.zeros((1, gamma), jnp.float32), ~one, one)
  # A first rejection: the prior keeps the row's estimate well above 0 (PRIOR_POSITIONS decayed once, over one more).
  kept = schedules.PRIOR_POSITIONS * schedules.ALPHA_DECAY
  assert float(missed.alpha[0]) == pytest.approx(kept / (kept + 1), rel=1e-6) and float(missed.alpha[0]) > 0.6
  assert new.alpha.tolist()[3] == 1.0  # no evidence yet: optimistic
  # One decision for the batch: every active row drafts the longest active row's length (the finished row's 5
  # does not count), or the batch rests when the active rows' mean estimate is below fallback_alpha.
  knobs = schedules.SpeculationKnobs.create(fallback_alpha=0.5, probe_interval=2)
  active = jnp.asarray([True, True, True, False])
  idle = jnp.asarray([1, 1, 1, 5], jnp.int32)
  low = new.replace(beta_sum=jnp.asarray([0.0, 0.0, 1.0, 1.0]), beta_count=jnp.ones(4), idle=idle,
                    length=jnp.asarray([2, 3, 1, 5], jnp.int32))
  limit, rest = schedules.limits("heuristic", gamma, knobs, low, active)
  assert rest.tolist() == [True, True, True, False] and limit.tolist() == [0, 0, 0, 0]  # mean 1/3 < 0.5
  limit, rest = schedules.limits("heuristic", gamma, knobs, low.replace(idle=idle.at[1].set(2)), active)
  assert rest.tolist() == [False] * 4 and limit.tolist() == [3, 3, 3, 0]  # a row's interval is due: a probe
  limit, rest = schedules.limits("heuristic", gamma, knobs, low.replace(beta_sum=jnp.asarray([0.0, 1, 1, 0])), active)
  assert rest.tolist() == [False] * 4 and limit.tolist() == [3, 3, 3, 0]  # mean 2/3: the batch drafts
  # Backoff: after 2 failed probes the interval is 2 * 2**2 = 8 idle iterations.
  backed = low.replace(probes=jnp.full((4,), 2, jnp.int32), idle=jnp.full((4,), 7, jnp.int32))
  assert schedules.limits("heuristic", gamma, knobs, backed, active)[1].tolist() == [True, True, True, False]
  backed = backed.replace(idle=jnp.full((4,), 8, jnp.int32))
  assert not any(schedules.limits("heuristic", gamma, knobs, backed, active)[1].tolist())


@pytest.mark.usefixtures("strict_ranks")
def test_adaptive_length_is_the_batch_s_theorem_3_8_choice():
  gamma, c = 6, jnp.float32(0.1)
  alpha = jnp.asarray([0.95, 0.1, 0.9, 0.0], jnp.float32)
  active = jnp.asarray([True, True, True, False])
  limit, _ = schedules.limits("adaptive", gamma, schedules.SpeculationKnobs.create(draft_cost=0.1),
                              schedules.ScheduleState.create(4, gamma).replace(beta_sum=alpha,
                                                                                beta_count=jnp.ones(4)), active)
  ks = np.arange(1, gamma + 1)
  total = sum(np.cumsum(np.float32(a) ** ks) + 1 for a in np.asarray(alpha)[:3])
  assert limit.tolist() == [int(ks[np.argmax(total / (1 + ks * 0.1))])] * 3 + [0]
  # Alone, each row would choose its own k: the batch's choice differs from the weak row's.
  alone = np.asarray(schedules.theory_length(alpha, c, gamma))
  assert alone[1] < limit[0] and alone[0] == gamma
  warm = schedules.ScheduleState.create(2, gamma, schedules.SpeculationKnobs.create(prior_alpha=0.25))
  assert float(warm.alpha[0]) == 0.25 and warm.probes.tolist() == [0, 0]  # prior_alpha; fallback off
  cold = schedules.ScheduleState.create(2, gamma, schedules.SpeculationKnobs.create(prior_alpha=0.25,
                                                                                 fallback_alpha=0.3))
  assert cold.probes.tolist() == [schedules.COLD_BACKOFF] * 2  # calibrated below the threshold: probes come late
  knobs = schedules.SpeculationKnobs.create(prior_alpha=0.25, fallback_alpha=0.3, probe_interval=2)
  interval = 2 * 2**schedules.COLD_BACKOFF
  for idle, rests in ((interval - 1, True), (interval, False)):
    _, resting = schedules.limits("adaptive", gamma, knobs, cold.replace(idle=jnp.full((2,), idle, jnp.int32)),
                                 jnp.ones((2,), bool))
    assert resting.tolist() == [rests] * 2


def _same_cache(decoder, params, got, want, sequences):
  """Both caches, at the same per-row positions, give the same logits for the next 3 tokens of each row: their
  valid entries agree (compared through the model, whatever its cache layout)."""
  np.testing.assert_array_equal(got.positions, want.positions)
  block = jnp.take_along_axis(sequences, got.positions[:, None] + jnp.arange(3)[None], axis=1)
  np.testing.assert_allclose(decoder.step(params, got, block).logits, decoder.step(params, want, block).logits,
                             atol=1e-5)


# --- exactness in the loop ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["heuristic", "adaptive"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_equals_plain_with_every_knob_on(pair, schedule, gamma):
  target, good, bad = pair
  prompts = _prompts()
  eos = _ragged_eos(jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW).tokens)
  target, good, bad = (_with_eos(m, eos) for m in (target, good, bad))
  plain = jaxspec.generate(target, prompts, max_new_tokens=MAX_NEW)
  assert len(set(plain.lengths.tolist())) > 2 and plain.lengths.min() < MAX_NEW  # EOS ends rows raggedly
  switched = 0
  for draft in (good, bad):
    out = jaxspec.generate(target, prompts, jaxspec.Speculation(draft, gamma=gamma, schedule=schedule, **KNOBS),
                           max_new_tokens=MAX_NEW)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    np.testing.assert_array_equal(out.lengths, plain.lengths)
    s = out.stats
    rested = s.fallback_iterations > 0
    drafting = s.draft_lengths[:, 1:].sum(1) > 0
    switched += int(np.sum(rested & drafting))
  assert switched > 0  # rows went from drafting to resting (and probed)


def test_catch_up_matches_a_fresh_prefill():
  """One catch-up call brings ragged lags (0, 1, gamma, > gamma) to the accepted sequence: its logits after each
  row's last token and the cache it leaves equal a fresh prefill fed the same tokens."""
  cfg = t5.T5Config(vocab_size=30, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=2, num_heads=2)
  params = t5.init_params(cfg, jax.random.key(3))
  decoder = t5.T5Decoder(cfg)
  gamma, max_new = 3, 20
  settings = loop.LoopSettings(target=decoder, drafter=ModelDrafter(decoder), gamma=gamma, max_new_tokens=max_new,
                               greedy=True, filtering=False, eos_ids=(1,), pad_id=0, schedule="heuristic")
  rng = np.random.RandomState(0)
  ids = jnp.asarray(rng.randint(2, 30, size=(4, 6)), jnp.int32)
  input_lengths = jnp.full((4,), 6, jnp.int32)
  sequences = jnp.asarray(rng.randint(2, 30, size=(4, settings.seq_len)), jnp.int32)
  catch_up = jax.jit(model_drafter.catch_up, static_argnums=(0, 1, 7))
  for lags in ([0, 1, 0, 1], [0, gamma, 1, 2], [1, gamma + 4, 0, 9]):
    lengths = jnp.asarray([12, 9, 15, 13], jnp.int32)
    dlen = lengths - 1 - jnp.asarray(lags, jnp.int32)
    cache = decoder.prefill(params, ids, input_lengths, settings.cache_len).cache
    cache = decoder.step(params, cache, sequences[:, :16]).cache  # stale entries beyond dlen, as in the loop
    cache = cache.rollback(dlen)
    logits, caught, base = catch_up(decoder, settings.proposal, params, cache, sequences, lengths,
                                    jnp.ones((4,), bool), True)
    np.testing.assert_array_equal(base, lengths)
    np.testing.assert_array_equal(caught.positions, lengths)
    fresh = decoder.prefill(params, ids, input_lengths, settings.cache_len).cache
    res = decoder.step(params, fresh, sequences[:, :16])
    fresh_logits, fresh = res.logits, res.cache
    want = jnp.take_along_axis(fresh_logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    np.testing.assert_allclose(logits, want, atol=1e-5)
    _same_cache(decoder, params, caught, fresh.rollback(lengths), sequences)


@pytest.mark.parametrize("probe_interval", [2, 12])  # lags that fit gamma + 1, and a full re-feed
def test_draft_cache_is_consistent_after_long_fallback(pair, probe_interval):
  """Rows rest for long stretches (fallback_alpha=1: any rejection sends a row resting) and come back; the final
  draft cache equals a fresh prefill fed the row's accepted tokens, and the output is the plain one."""
  target, good, _ = pair
  prompts = _prompts(1)
  gamma, max_new = 3, 40
  plain = jaxspec.generate(target, prompts, max_new_tokens=max_new)
  ids, input_lengths = arguments.prepare_inputs(target, prompts, 512)
  settings = loop.LoopSettings(target=target.decoder(), drafter=ModelDrafter(good.decoder()), gamma=gamma,
                               max_new_tokens=max_new, greedy=True, filtering=False,
                               eos_ids=tuple(target.config.eos_token_ids), pad_id=target.config.pad_token_id,
                               schedule="heuristic")
  tc, dc, first = jax.jit(loop.prefill, static_argnums=0)(settings, target.params, good.params, ids, input_lengths)
  spec = schedules.SpeculationKnobs.create(fallback_alpha=1.0, probe_interval=probe_interval)
  seeds = np.zeros((len(prompts),), np.uint32)
  state = jax.jit(loop.run, static_argnums=0)(settings, target.params, good.params, tc, dc, first,
                                              sampling.SamplingKnobs.create(0.0, 0, 1.0), seeds,
                                              np.arange(len(prompts), dtype=np.int32), spec)
  lengths = np.asarray(state.lengths)
  np.testing.assert_array_equal(np.asarray(state.sequences)[:, 1:1 + max_new][:, :plain.tokens.shape[1]] *
                                (np.arange(max_new)[None] < (lengths - 1)[:, None]), plain.tokens)
  stats = jax.device_get(state.stats)
  long = stats.iterations >= 10
  assert long.sum() >= 2
  assert np.all(stats.fallback_iterations[long] >= probe_interval)  # long resting stretches
  assert np.all(stats.draft_lengths[long, 1:].sum(1) >= 2)  # and drafting again after them
  positions = np.asarray(state.draft_state.positions)
  assert np.all(positions <= lengths - 1)
  decoder = good.decoder()
  fresh = decoder.prefill(good.params, ids, input_lengths, settings.cache_len).cache
  fresh = decoder.step(good.params, fresh, state.sequences[:, :int(positions.max())]).cache
  _same_cache(decoder, good.params, state.draft_state, fresh.rollback(state.draft_state.positions), state.sequences)


# --- stats, compilation, arguments ---------------------------------------------------------------------------------


def test_stats_count_what_was_drafted(pair):
  target, good, _ = pair
  gamma = 4
  out = jaxspec.generate(target, _prompts(), jaxspec.Speculation(good, gamma=gamma, schedule="adaptive", draft_confidence=0.3, fallback_alpha=0.4, draft_cost=0.1), max_new_tokens=MAX_NEW)
  s = out.stats
  assert np.all(s.draft_lengths.sum(1) == s.iterations)
  assert np.all(s.drafted == (s.draft_lengths * np.arange(gamma + 1)).sum(1))
  assert np.all(s.accepted_per_position <= s.drafted_per_position)
  assert np.all(s.accepted_per_position.sum(1) == s.accepted)
  assert np.all(s.generated <= s.accepted + s.iterations)
  assert len(set(np.flatnonzero(s.draft_lengths.sum(0)).tolist())) > 1  # several lengths were used
  per_position = s.acceptance_per_position
  drafted = s.drafted_per_position.sum(0)
  np.testing.assert_allclose(per_position[drafted > 0], s.accepted_per_position.sum(0)[drafted > 0] /
                             drafted[drafted > 0])
  constant = jaxspec.generate(target, _prompts(), jaxspec.Speculation(good, gamma=gamma), max_new_tokens=MAX_NEW).stats
  assert np.all(constant.drafted == gamma * constant.iterations) and constant.fallback_iterations.sum() == 0
  np.testing.assert_allclose(constant.acceptance_per_position,
                             constant.accepted_per_position.sum(0) / constant.iterations.sum())


def test_runtime_knobs_do_not_recompile(pair):
  target, good, _ = pair
  speculation, sampling_ = jaxspec.Speculation(good, gamma=3, schedule="adaptive"), jaxspec.Sampling(0.7)
  jaxspec.generate(target, [[5, 6, 7, 1]], speculation, sampling_, max_new_tokens=6)
  sizes = placement.compiled_counts()
  jaxspec.generate(target, [[9, 8, 7, 1]], speculation.replace(draft_confidence=0.5, fallback_alpha=0.3,
                                                               probe_interval=7, draft_cost=0.2, prior_alpha=0.4),
                   jaxspec.Sampling(0.3), max_new_tokens=6, seed=9)
  assert placement.compiled_counts() == sizes
  jaxspec.generate(target, [[9, 8, 7, 1]], speculation.replace(schedule="heuristic"), sampling_, max_new_tokens=6)
  assert placement.compiled_counts()[1] > sizes[1]  # a new schedule is a new program: the count can change


def test_bad_arguments_are_clear_errors(pair):
  target, good, _ = pair
  cases = [
      (dict(schedule="fast"), "schedule must be one of"),
      (dict(draft_confidence=1.0, schedule="adaptive"), r"draft_confidence must be in \[0, 1\)"),
      (dict(fallback_alpha=-0.1, schedule="adaptive"), r"fallback_alpha must be in \[0, 1\]"),
      (dict(probe_interval=0, schedule="adaptive"), "probe_interval must be an integer >= 1"),
      (dict(draft_cost=-1.0, schedule="adaptive"), "draft_cost must be a finite number >= 0"),
      (dict(draft_confidence=0.5), "need schedule='heuristic' or 'adaptive'"),
      (dict(fallback_alpha=0.5), "need schedule='heuristic' or 'adaptive'"),
  ]
  for kwargs, message in cases:
    with pytest.raises(jaxspec.SettingsError, match=message):
      jaxspec.Speculation(good, **kwargs)
  with pytest.raises(jaxspec.SettingsError, match="NGramDraft"):
    jaxspec.Speculation("ngram")
  with pytest.raises(jaxspec.SettingsError, match="wrap a draft as jaxspec.Speculation"):
    jaxspec.generate(target, [[5, 6, 1]], good)
