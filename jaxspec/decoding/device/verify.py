"""Deciding, per row, how many drafted tokens to keep and which token comes next (REFERENCE.md steps 3-4).

Shapes: B rows, G = gamma, the most tokens a row drafts, V vocabulary. Row j of the target's verify pass
(j = 0..G) predicts the token after draft position j, so p has G + 1 rows and the last one gives the bonus token.

Rows may draft fewer than G tokens (`num_drafted` [B], k per row; None means every row drafted G): positions
at and after k are not drafts and are never accepted, so at most k are kept, and when all k are, the next token
is drawn from p at position k (no residual: nothing was drafted there). k = 0 is plain decoding for that row.
Drafts without a draft model (prompt lookup) are deterministic: pass q=None and q is one-hot on each draft token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding.device import sampling

# A residual with less mass than this is rounding noise from p == q (rejection then has probability ~0):
# sample from p instead, never renormalise noise (REFERENCE.md pitfall 2).
RESIDUAL_FLOOR = 1e-6


@struct.dataclass
class Acceptance:
  """What verification kept of a chain, per row (what the loop emits; not the drafter's `drafter.Verdict`, which
  the loop builds from it for `Drafter.settle`)."""

  num_accepted: jax.Array  # [B] int32 in [0, k]: the longest accepted prefix of the draft.
  next_token: jax.Array  # [B] int32: the correction (at the first rejection) or the bonus token.
  beta: jax.Array  # [B, G] float32: sum_x min(p(x), q(x)) per drafted position (argmax agreement when greedy); 0
  #                  at positions that were not drafted.


def _leading_true(flags: jax.Array) -> jax.Array:
  """[B, G] bool -> [B] int32 count of leading True values."""
  return jnp.sum(jnp.cumprod(flags.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def _drafted(num_drafted: jax.Array | None, gamma: int) -> jax.Array | None:
  """[B, G] bool: position j was drafted (j < k); None when every position was."""
  return None if num_drafted is None else jnp.arange(gamma)[None] < num_drafted[:, None]


def accept_greedy(draft_tokens: jax.Array, target_logits: jax.Array,
                  num_drafted: jax.Array | None = None) -> Acceptance:
  """Temperature 0: keep the longest drafted prefix equal to the target's argmax; next token = the argmax after it.

  Args:
    draft_tokens: [B, G] int (the draft's argmax tokens, or deterministic proposals).
    target_logits: [B, G + 1, V].
    num_drafted: [B] int32 tokens each row really drafted (k <= G), or None for G.
  """
  best = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, G + 1]
  match = draft_tokens == best[:, :-1]
  drafted = _drafted(num_drafted, draft_tokens.shape[1])
  if drafted is not None:
    match &= drafted
  n = _leading_true(match)
  next_token = jnp.take_along_axis(best, n[:, None], axis=1)[:, 0]
  return Acceptance(num_accepted=n, next_token=next_token, beta=match.astype(jnp.float32))


def residual_probs(p: jax.Array, q: jax.Array) -> jax.Array:
  """norm(max(0, p - q)) in float32, falling back to p where the residual has (almost) no mass. [..., V]."""
  r = jnp.maximum(p.astype(jnp.float32) - q.astype(jnp.float32), 0.0)
  mass = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(mass > RESIDUAL_FLOOR, r / jnp.where(mass > RESIDUAL_FLOOR, mass, 1.0), p)


def accept_sampled(key: jax.Array, draft_tokens: jax.Array, q: jax.Array | None, p: jax.Array,
                   num_drafted: jax.Array | None = None) -> Acceptance:
  """Leviathan et al.'s rejection rule: accept x_j while u_j < min(1, p_j(x_j) / q_j(x_j)).

  Args:
    key: [B] PRNG keys for this step, one per row (or a single key: the row index is then folded in).
    draft_tokens: [B, G] int, drawn from q.
    q: [B, G, V] float32, exactly the probabilities the draft tokens were drawn from; None for deterministic
      proposals (q one-hot on the draft token: accepted with probability p(x), residual p without x).
    p: [B, G + 1, V] float32, the target's probabilities after the same warping.
    num_drafted: [B] int32 tokens each row really drafted (k <= G), or None for G.
  """
  batch, gamma = draft_tokens.shape
  keys = sampling.row_keys(key, batch)
  accept_key, token_key = (jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i) for i in (0, 1))
  p_draft = jnp.take_along_axis(p[:, :gamma], draft_tokens[..., None], axis=-1)[..., 0]  # [B, G]
  u = sampling.uniform(accept_key, (batch, gamma))
  if q is None:
    accept = u < p_draft
  else:
    q_draft = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]  # [B, G]
    accept = u * q_draft < p_draft  # u < p/q without dividing; q(x) > 0 since x was drawn from q.
  drafted = _drafted(num_drafted, gamma)
  if drafted is not None:
    accept &= drafted
  n = _leading_true(accept)
  # The next token comes from the residual at the first rejection, or from p itself after all k drafts were
  # accepted (a zero q row makes the residual equal to p).
  p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]  # [B, V]
  if q is None:
    x_n = jnp.take_along_axis(draft_tokens, jnp.minimum(n, gamma - 1)[:, None], axis=1)[:, 0] if gamma else n
    q_n = jax.nn.one_hot(x_n, p.shape[-1], dtype=jnp.float32) * (n < (gamma if num_drafted is None else
                                                                       num_drafted))[:, None]
    beta = p_draft
  else:
    q_ext = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)  # [B, G + 1, V]
    q_n = jnp.take_along_axis(q_ext, n[:, None, None], axis=1)[:, 0]
    if num_drafted is not None:
      q_n = jnp.where((n < num_drafted)[:, None], q_n, 0.0)
    beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)
  next_token = sampling.sample(token_key, residual_probs(p_n, q_n))
  if drafted is not None:
    beta = jnp.where(drafted, beta, 0.0)
  return Acceptance(num_accepted=n, next_token=next_token, beta=beta)
