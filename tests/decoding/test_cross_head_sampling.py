"""Lossless sampling with a T5 target's feature head (jaxspec.decoding.drafters.cross_head_drafter): chi-square of whole
outputs against an exact enumeration, and a negative control that must fail.

A Markov stub target with an "encoder" (stub_models.MarkovEncoderFeatureDecoder) of a 5-token vocabulary, so that
the joint distribution of whole outputs is enumerated exactly; a random T5 head with a 4-token draft vocabulary
(q is 0 on the fifth token) whose cross-attention reads each row's own random input (so q differs per row, p not).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.decoding.device import loop, sampling, schedules, verify
from jaxspec.decoding.drafters.cross_head_drafter import CrossHeadDrafter
from jaxspec.models import eagle3

from stub_models import MarkovEncoderFeatureDecoder, chi_square, chi_square_limit, exact_sequence_probs, np_warp

SV, LENGTH, SEOS, START, ROWS = 5, 3, 4, 0, 4000


def _stub():
  rng = np.random.RandomState(0)
  target = {"table": jnp.asarray(rng.randn(SV, SV) * 2.0, jnp.float32),
            "position_bias": jnp.asarray(rng.randn(16, SV) * 2.0, jnp.float32),
            "features": jnp.asarray(rng.randn(SV, 8), jnp.float32),
            "encoder": jnp.asarray(rng.randn(8, 6) * 2.0, jnp.float32)}
  cfg = eagle3.Eagle3Config(vocab_size=SV, draft_vocab_size=4, hidden_size=8, target_hidden_size=8,
                            intermediate_size=16, num_heads=2, num_kv_heads=1, head_dim=4, encoder_hidden_size=6)
  head = eagle3.init_params(cfg, jax.random.PRNGKey(2), std=0.7)
  draft = {"head": head, "embed": jnp.asarray(rng.randn(SV, 8), jnp.float32)}
  ids = jnp.asarray(rng.randint(1, 8, (ROWS, 4)), jnp.int32).at[:, 3].set(0)  # each row its own input, padded
  return target, cfg, draft, ids


def _sample(gamma, schedule="constant", spec=None, temperature=1.0, top_k=0):
  target, cfg, draft, ids = _stub()
  settings = loop.LoopSettings(target=MarkovEncoderFeatureDecoder(),
                               drafter=CrossHeadDrafter(eagle3.Eagle3Head(cfg), (1, 2, 3), SV),
                               gamma=gamma, max_new_tokens=LENGTH, greedy=False, filtering=top_k > 0,
                               eos_ids=(SEOS,), pad_id=0, schedule=schedule)
  lengths = jnp.full((ROWS,), 3, jnp.int32)
  tc, dc, first = jax.jit(loop.prefill, static_argnums=0)(settings, target, draft, ids, lengths)
  state = jax.jit(loop.run, static_argnums=0)(settings, target, draft, tc, dc, first,
                                              sampling.SamplingKnobs.create(temperature, top_k, 1.0),
                                              np.zeros((ROWS,), np.uint32), np.arange(ROWS, dtype=np.int32), spec)
  seqs, lens = jax.device_get((state.sequences, state.lengths))
  samples = [tuple(s[1:n]) for s, n in zip(seqs, lens)]
  table, pos = np.asarray(target["table"]), np.asarray(target["position_bias"])
  exact = exact_sequence_probs(lambda prefix: np_warp(table[prefix[-1]] + pos[len(prefix) - 1], temperature, top_k),
                               SV, LENGTH, SEOS, START)
  return samples, exact, state


@pytest.mark.parametrize("gamma,schedule,top_k", [(3, "constant", 0), (3, "adaptive", 3)])
def test_lossless_sampling(gamma, schedule, top_k):
  spec = None
  if schedule != "constant":
    spec = schedules.SpeculationKnobs.create(draft_confidence=0.5, fallback_alpha=0.6, probe_interval=1,
                                            draft_cost=0.1, prior_alpha=0.6)
  samples, exact, state = _sample(gamma, schedule, spec, temperature=0.9 if top_k else 1.0, top_k=top_k)
  stat, dof = chi_square(samples, exact)
  assert stat < chi_square_limit(dof), (stat, dof)
  accepted, drafted = int(state.stats.accepted.sum()), int(state.stats.drafted.sum())
  assert 0 < accepted < drafted
  if schedule != "constant":
    assert int(state.stats.fallback_iterations.sum()) > 0


def test_a_broken_rule_is_caught(monkeypatch):
  """Drawing the correction token from p instead of the residual norm(max(0, p - q)) fails the same test."""
  jax.clear_caches()
  monkeypatch.setattr(verify, "residual_probs", lambda p, q: p)
  try:
    samples, exact, _ = _sample(3)
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  stat, dof = chi_square(samples, exact)
  assert stat > 3 * chi_square_limit(dof), (stat, dof)
