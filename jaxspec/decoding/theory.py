"""The paper's analysis: expected tokens per iteration and walltime speedup (Leviathan et al. 2023, Sec. 3).

alpha: expected acceptance rate E[beta]; gamma: draft tokens per iteration; c: cost of a draft step relative to
a target step; r: cost of the target scoring gamma + 1 tokens relative to 1 token (1 on the paper's TPUs, more
on CPUs and at large batch).
"""

from __future__ import annotations


def _check(alpha: float, gamma: int, c: float) -> None:
  if not 0 <= alpha <= 1:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
  if gamma < 0:
    raise ValueError(f"gamma must be >= 0, got {gamma}.")
  if c < 0:
    raise ValueError(f"c must be >= 0, got {c}.")


def expected_tokens_per_iteration(alpha: float, gamma: int) -> float:
  """(1 - alpha^(gamma+1)) / (1 - alpha): tokens emitted per target call, bonus token included (Eq. 1)."""
  _check(alpha, gamma, 0.0)
  if alpha == 1:
    return float(gamma + 1)
  return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_speedup(alpha: float, gamma: int, c: float, r: float | None = None) -> float:
  """Theorem 3.8: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

  With a measured verify-cost ratio r (target time for gamma + 1 tokens / for 1 token), the denominator's
  "+ 1" becomes r: speedup = E[tokens] / (gamma c + r).
  """
  _check(alpha, gamma, c)
  verify_cost = 1.0 if r is None else r
  return expected_tokens_per_iteration(alpha, gamma) / (gamma * c + verify_cost)


def best_gamma(alpha: float, c: float, r_of_gamma=None, max_gamma: int = 16) -> tuple[int, float]:
  """The gamma in [1, max_gamma] that maximises the expected speedup, and that speedup.

  Args:
    r_of_gamma: optional callable gamma -> measured verify-cost ratio r (default: r = 1).
  """
  best = max(range(1, max_gamma + 1),
             key=lambda g: expected_speedup(alpha, g, c, None if r_of_gamma is None else r_of_gamma(g)))
  return best, expected_speedup(alpha, best, c, None if r_of_gamma is None else r_of_gamma(best))
