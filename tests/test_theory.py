"""Theorem 3.8 against the paper's Table 2 "Exp" column, and the gamma helper."""

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
  assert jaxspec.best_gamma(0.1, 0.5)[0] == 1
