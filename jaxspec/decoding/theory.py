"""The paper's analysis: expected tokens per iteration and walltime speedup (Leviathan et al. 2023, Sec. 3).

alpha: expected acceptance rate E[beta]; gamma: draft tokens per iteration; c: cost of a draft step relative to
a target step; r: cost of the target scoring gamma + 1 tokens relative to 1 token (1 on the paper's TPUs, more
on CPUs and at large batch).
"""

from __future__ import annotations

import numpy as np

from jaxspec.errors import SettingsError


def _check(alpha: float, gamma: int, c: float) -> None:
  if not 0 <= alpha <= 1:
    raise SettingsError(f"alpha must be in [0, 1], got {alpha}.")
  if gamma < 0:
    raise SettingsError(f"gamma must be >= 0, got {gamma}.")
  if c < 0:
    raise SettingsError(f"c must be >= 0, got {c}.")


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
  """The gamma in [1, max_gamma] that maximises the expected speedup, and that speedup; (0, 1.0) when no gamma
  is expected to beat plain decoding (speedup <= 1): 0 means decode plainly.

  Args:
    r_of_gamma: optional callable gamma -> measured verify-cost ratio r (default: r = 1).
  """
  best = max(range(1, max_gamma + 1),
             key=lambda g: expected_speedup(alpha, g, c, None if r_of_gamma is None else r_of_gamma(g)))
  speedup = expected_speedup(alpha, best, c, None if r_of_gamma is None else r_of_gamma(best))
  return (best, speedup) if speedup > 1 else (0, 1.0)


def iterations_cdf(alpha: float, gamma: int, max_tokens: int) -> np.ndarray:
  """P(iterations <= i) for emitting n tokens, under the theorem's i.i.d. acceptance: array [n + 1, n + 1].

  An iteration emits K + 1 tokens, K = accepted drafts: P(K = k) = alpha^k (1 - alpha) for k < gamma and
  alpha^gamma for k = gamma (Sec. 3.3). The last iteration of a sequence is cut at its end (EOS or the token
  budget), so a sequence of n tokens needs I(n) iterations with I(n) = 1 + I(n - K - 1), I(m <= 0) = 0.
  Entry [n, i] is P(I(n) <= i); each iteration emits at least one token, so I(n) <= n.
  """
  _check(alpha, gamma, 0.0)
  p = np.array([alpha ** k * (1 - alpha) for k in range(gamma)] + [alpha ** gamma])
  cdf = np.zeros((max_tokens + 1, max_tokens + 1))
  cdf[0, :] = 1.0
  for n in range(1, max_tokens + 1):
    rest = np.maximum(n - 1 - np.arange(gamma + 1), 0)  # tokens left after an iteration emitting K + 1
    cdf[n, 1:] = p @ cdf[rest, :-1]
  return cdf


def expected_iterations(lengths, alpha: float, gamma: int) -> float:
  """Expected target calls to decode one batch whose rows emit `lengths` tokens (EOS included) together.

  The loop runs until its slowest row is done, so this is E[max_b I(lengths[b])] (see `iterations_cdf`). For
  one long sequence it tends to n / expected_tokens_per_iteration(alpha, gamma); short sequences need more per
  token, because their last iteration is cut short.
  """
  lengths = [int(n) for n in lengths]
  if not lengths or min(lengths) < 0:
    raise SettingsError(f"lengths must be a non-empty list of token counts >= 0, got {lengths}.")
  cdf = iterations_cdf(alpha, gamma, max(lengths))
  all_done = np.prod(cdf[lengths, :], axis=0)  # P(every row done within i iterations), i = 0..max
  return float(np.sum(1.0 - all_done))


def expected_speedup_for_workload(batch_lengths, alpha: float, gamma: int, c: float, r: float | None = None,
                                  fixed_cost: float = 0.0, fixed_cost_speculative: float | None = None) -> float:
  """Theorem 3.8's model applied to a finite workload: the batches actually decoded, one call each.

  Plain decoding of a batch costs fixed_cost + max(lengths) target steps; speculative decoding costs
  fixed_cost_speculative + expected_iterations(lengths) * (gamma c + r). Times are in units of one target step
  (1 token per row). What this adds to `expected_speedup`: the last iteration of each sequence is cut at EOS
  (short sequences waste part of it), a batch waits for its slowest row, and each call pays work outside the
  loop (the encoders: fixed_cost for plain decoding, fixed_cost_speculative with the draft's encoder too).

  Args:
    batch_lengths: per decoder call, the tokens each row emits (EOS included), e.g. [[21], [17], ...] at batch 1.
    fixed_cost, fixed_cost_speculative: one number for every call, or one per call (e.g. per prompt length).
  """
  _check(alpha, gamma, c)
  verify_cost = 1.0 if r is None else r
  calls = len(batch_lengths)
  plain_fixed = np.broadcast_to(np.asarray(fixed_cost, np.float64), (calls,))
  spec_fixed = plain_fixed if fixed_cost_speculative is None else np.broadcast_to(
      np.asarray(fixed_cost_speculative, np.float64), (calls,))
  plain = sum(f + max(int(n) for n in lengths) for f, lengths in zip(plain_fixed, batch_lengths))
  spec = sum(f + expected_iterations(lengths, alpha, gamma) * (gamma * c + verify_cost)
             for f, lengths in zip(spec_fixed, batch_lengths))
  return float(plain / spec)
