"""What the loop counts and `jaxspec.generate` returns (`DecodeStats`: on the device in the loop, numpy on the
host), and the call's whole output (`GenerateOutput`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class DecodeStats:
  """What happened inside the loop, per row: the loop accumulates it on the device (`create`, `add`) and
  `jaxspec.generate` returns it on the host (numpy arrays, `generated` filled in), with batch means as properties.

  alpha is the paper's acceptance-rate estimate: the mean over verified draft positions (those up to and
  including each iteration's first rejection) of beta = sum_x min(p(x), q(x)). At temperature 0 beta is 1 when
  the draft's argmax equals the target's and 0 otherwise. It is NOT accepted / drafted (which also counts the
  positions after a rejection that were never judged). With schedule="constant" every row drafts gamma tokens
  per iteration; other schedules, draft_confidence, fallback and NGramDraft draft k <= gamma (`draft_lengths`).
  G = gamma (the most a row drafts).
  """

  iterations: Any  # [B] int32 target calls per row (each emits 1 to gamma + 1 tokens).
  drafted: Any  # [B] int32 draft tokens really proposed (k per iteration).
  accepted: Any  # [B] int32 draft tokens accepted by verification (before EOS / max_new_tokens cuts).
  accepted_per_position: Any  # [B, G] int32: how often draft position j was accepted.
  beta_sum: Any  # [B] float32 sum of beta = sum_x min(p, q) over verified positions (see `beta_count`).
  beta_count: Any  # [B] int32 verified positions: drafted ones up to and including the first rejection.
  draft_lengths: Any  # [B, G + 1] int32: iterations in which the row drafted k = 0..G tokens.
  fallback_iterations: Any  # [B] int32: iterations in which the row rested (fallback_alpha).
  generated: Any = None  # [B] tokens emitted (== output lengths); filled in on the host (None in the loop).

  @classmethod
  def create(cls, batch: int, gamma: int) -> "DecodeStats":
    zeros = jnp.zeros((batch,), jnp.int32)
    return cls(iterations=zeros, drafted=zeros, accepted=zeros,
               accepted_per_position=jnp.zeros((batch, gamma), jnp.int32),
               beta_sum=jnp.zeros((batch,), jnp.float32), beta_count=zeros,
               draft_lengths=jnp.zeros((batch, gamma + 1), jnp.int32), fallback_iterations=zeros)

  def add(self, active: jax.Array, drafted: jax.Array, accepted: jax.Array, beta: jax.Array,
          resting: jax.Array | None) -> "DecodeStats":
    """One iteration: active [B] bool, drafted (k) and accepted (n <= k) [B] int32, beta [B, G]."""
    gamma = self.accepted_per_position.shape[1]
    a = active.astype(jnp.int32)
    positions = jnp.arange(gamma)[None]
    verified = positions < jnp.minimum(accepted + 1, drafted)[:, None]  # [B, G] up to the first rejection
    return DecodeStats(
        iterations=self.iterations + a,
        drafted=self.drafted + drafted * a,
        accepted=self.accepted + accepted * a,
        accepted_per_position=self.accepted_per_position + (positions < accepted[:, None]) * a[:, None],
        beta_sum=self.beta_sum + jnp.sum(beta * verified, axis=1) * a,
        beta_count=self.beta_count + jnp.sum(verified, axis=1) * a,
        draft_lengths=self.draft_lengths + (jnp.arange(gamma + 1)[None] == drafted[:, None]) * a[:, None],
        fallback_iterations=self.fallback_iterations + (0 if resting is None else resting * a))

  @property
  def tokens_per_iteration(self) -> float:
    """Mean tokens emitted per target call, bonus/correction token included (1.0 for plain decoding)."""
    return float(self.generated.sum() / max(self.iterations.sum(), 1))

  @property
  def tokens_per_iteration_per_row(self) -> np.ndarray:
    return self.generated / np.maximum(self.iterations, 1)

  @property
  def alpha(self) -> float:
    """Batch estimate of alpha = E[beta] (NaN without a draft)."""
    count = self.beta_count.sum()
    return float(self.beta_sum.sum() / count) if count else float("nan")

  @property
  def alpha_per_row(self) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
      return self.beta_sum / self.beta_count

  @property
  def acceptance_rate(self) -> float:
    """accepted / drafted: a different quantity from alpha (see the class docstring)."""
    drafted = self.drafted.sum()
    return float(self.accepted.sum() / drafted) if drafted else float("nan")

  @property
  def drafted_per_position(self) -> np.ndarray:
    """[B, gamma]: iterations in which draft position j was drafted (k > j)."""
    return np.cumsum(self.draft_lengths[:, ::-1], axis=1)[:, ::-1][:, 1:]

  @property
  def acceptance_per_position(self) -> np.ndarray:
    """[gamma]: batch fraction of the iterations that drafted position j in which it was accepted (NaN where
    never drafted). With schedule="constant", the fraction of all iterations."""
    drafted = self.drafted_per_position.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.where(drafted > 0, self.accepted_per_position.sum(0) / np.maximum(drafted, 1), np.nan)

  @property
  def mean_draft_length(self) -> float:
    """Draft tokens proposed per iteration (gamma for schedule="constant")."""
    return float(self.drafted.sum() / max(self.iterations.sum(), 1))

  @classmethod
  def concatenate(cls, stats: Sequence["DecodeStats"]) -> "DecodeStats":
    """The stats of several generate calls (same gamma) as one, rows stacked: batch means then cover them all."""
    return cls(**{f.name: np.concatenate([getattr(s, f.name) for s in stats])
                  for f in dataclasses.fields(cls)})

  def select(self, rows) -> "DecodeStats":
    """The stats of some rows only (an index, slice or boolean mask over the batch): e.g. drop padding rows."""
    return DecodeStats(**{f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self)})

  def summary(self) -> dict:
    return {"iterations": int(self.iterations.sum()), "generated": int(self.generated.sum()),
            "drafted": int(self.drafted.sum()), "accepted": int(self.accepted.sum()), "alpha": self.alpha,
            "acceptance_rate": self.acceptance_rate, "tokens_per_iteration": self.tokens_per_iteration,
            "acceptance_per_position": self.acceptance_per_position.tolist(),
            "mean_draft_length": self.mean_draft_length, "draft_lengths": self.draft_lengths.sum(0).tolist(),
            "fallback_iterations": int(self.fallback_iterations.sum())}


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  tokens: np.ndarray  # [B, max_new_tokens] int32: only the new tokens (never the prompt), EOS included, pad after.
  lengths: np.ndarray  # [B] tokens generated per row (EOS included).
  stats: DecodeStats
  texts: list[str] | None = None  # Decoded outputs when the target has a tokenizer.
  failed: np.ndarray | None = None  # [B] bool: rows stopped by non-finite logits (see `generate`'s on_failure).
