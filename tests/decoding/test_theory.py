"""Theorem 3.8 against the paper's Table 2 "Exp" column, and the gamma helper."""

import numpy as np
import pytest

import jaxspec

# Task, draft, temperature, gamma, alpha, c, Exp (Leviathan et al. 2023, Table 2).
TABLE2 = [
    ("EnDe", "small", 0, 7, 0.75, 0.02, 3.2), ("EnDe", "base", 0, 7, 0.80, 0.04, 3.3),
    ("EnDe", "large", 0, 7, 0.82, 0.11, 2.5), ("EnDe", "small", 1, 7, 0.62, 0.02, 2.3),
    ("EnDe", "base", 1, 5, 0.68, 0.04, 2.4), ("EnDe", "large", 1, 3, 0.71, 0.11, 2.0),
    ("CNNDM", "small", 0, 5, 0.65, 0.02, 2.4), ("CNNDM", "base", 0, 5, 0.73, 0.04, 2.6),
    ("CNNDM", "large", 0, 3, 0.74, 0.11, 2.0), ("CNNDM", "small", 1, 5, 0.53, 0.02, 1.9),
    ("CNNDM", "base", 1, 3, 0.55, 0.04, 1.8), ("CNNDM", "large", 1, 3, 0.56, 0.11, 1.6),
]


@pytest.mark.parametrize("task,draft,temp,gamma,alpha,c,exp", TABLE2)
def test_expected_speedup_reproduces_table2(task, draft, temp, gamma, alpha, c, exp):
  # The table prints alpha and c to 2 decimals and Exp to 1: Exp must lie within the formula's range over the
  # alphas and c's that round to the printed ones (speedup grows with alpha, falls with c), plus Exp's rounding.
  lo = jaxspec.expected_speedup(alpha - 0.005, gamma, c + 0.005)
  hi = jaxspec.expected_speedup(alpha + 0.005, gamma, c - 0.005)
  assert lo - 0.05 <= exp <= hi + 0.05
  assert lo < jaxspec.expected_speedup(alpha, gamma, c) < hi


def test_verify_cost_ratio_and_limits():
  assert jaxspec.expected_tokens_per_iteration(0.0, 5) == 1.0
  assert jaxspec.expected_tokens_per_iteration(1.0, 5) == 6.0
  assert jaxspec.expected_speedup(0.8, 4, 0.05, r=1.0) == jaxspec.expected_speedup(0.8, 4, 0.05)
  assert jaxspec.expected_speedup(0.8, 4, 0.05, r=1.5) < jaxspec.expected_speedup(0.8, 4, 0.05)
  with pytest.raises(ValueError):
    jaxspec.expected_speedup(1.2, 4, 0.05)


def test_best_gamma():
  gamma, speedup = jaxspec.best_gamma(0.75, 0.02)
  assert speedup == max(jaxspec.expected_speedup(0.75, g, 0.02) for g in range(1, 17))
  assert 5 <= gamma <= 9  # the paper used gamma = 7 here; the optimum is flat
  # A verify cost that grows with gamma pulls the best gamma down.
  g_cpu, _ = jaxspec.best_gamma(0.75, 0.02, r_of_gamma=lambda g: 1 + 0.15 * g)
  assert g_cpu < gamma
  assert jaxspec.best_gamma(0.1, 0.5) == (0, 1.0)  # no gamma beats plain decoding: 0, decode plainly


def _simulated_iterations(lengths, alpha, gamma, trials, rng):
  """Monte Carlo of the loop's iteration count under i.i.d. acceptance: rows decoded together, cut at their end."""
  counts = []
  for _ in range(trials):
    worst = 0
    for n in lengths:
      emitted, iterations = 0, 0
      while emitted < n:
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
          accepted += 1
        emitted += accepted + 1
        iterations += 1
      worst = max(worst, iterations)
    counts.append(worst)
  return float(np.mean(counts)), float(np.std(counts) / np.sqrt(trials))


@pytest.mark.parametrize("lengths,alpha,gamma", [([21], 0.85, 3), ([7], 0.5, 6), ([12, 30, 5, 18], 0.8, 4)])
def test_expected_iterations_matches_simulation(lengths, alpha, gamma):
  mean, sem = _simulated_iterations(lengths, alpha, gamma, 20_000, np.random.default_rng(0))
  assert abs(jaxspec.expected_iterations(lengths, alpha, gamma) - mean) < 5 * sem + 1e-9


def test_expected_iterations_limits():
  assert jaxspec.expected_iterations([20], 1.0, 3) == 5  # every block of 4 accepted
  assert jaxspec.expected_iterations([21], 1.0, 3) == 6  # the last block is cut after 1 token
  assert jaxspec.expected_iterations([20], 0.0, 3) == 20
  # Long sequences: tokens per iteration tends to Eq. 1; short ones lose part of their last iteration.
  per_iter = 2000 / jaxspec.expected_iterations([2000], 0.8, 4)
  assert per_iter == pytest.approx(jaxspec.expected_tokens_per_iteration(0.8, 4), rel=2e-3)
  assert 20 / jaxspec.expected_iterations([20], 0.8, 4) < per_iter
  # A batch waits for its slowest row.
  assert jaxspec.expected_iterations([20, 20], 0.8, 4) > jaxspec.expected_iterations([20], 0.8, 4)


def test_workload_speedup_reduces_to_theorem_for_long_sequences():
  exact = jaxspec.expected_speedup(0.75, 7, 0.02, r=1.1)
  assert jaxspec.expected_speedup_for_workload([[5000]], 0.75, 7, 0.02, r=1.1) == pytest.approx(exact, rel=2e-3)
  short = jaxspec.expected_speedup_for_workload([[20]] * 3, 0.75, 7, 0.02, r=1.1)
  with_encoder = jaxspec.expected_speedup_for_workload([[20]] * 3, 0.75, 7, 0.02, r=1.1, fixed_cost=3.0,
                                                       fixed_cost_speculative=3.2)
  assert with_encoder < short < exact  # fixed costs per call pull the speedup toward 1
  with pytest.raises(ValueError):
    jaxspec.expected_iterations([], 0.8, 3)
