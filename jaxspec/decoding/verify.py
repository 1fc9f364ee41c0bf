"""Deciding, per row, how many drafted tokens to keep and which token comes next (REFERENCE.md steps 3-4).

Shapes: B rows, G = gamma drafted tokens, V vocabulary. Row j of the target's verify pass (j = 0..G) predicts
the token after draft position j, so p has G + 1 rows and the last one gives the bonus token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding import sampling

# A residual with less mass than this is rounding noise from p == q (rejection then has probability ~0):
# sample from p instead, never renormalise noise (REFERENCE.md pitfall 2).
RESIDUAL_FLOOR = 1e-6


@struct.dataclass
class Verdict:
  num_accepted: jax.Array  # [B] int32 in [0, G]: the longest accepted prefix of the draft.
  next_token: jax.Array  # [B] int32: the correction (at the first rejection) or the bonus token.
  beta: jax.Array  # [B, G] float32: sum_x min(p(x), q(x)) per draft position (argmax agreement when greedy).


def _leading_true(flags: jax.Array) -> jax.Array:
  """[B, G] bool -> [B] int32 count of leading True values."""
  return jnp.sum(jnp.cumprod(flags.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def accept_greedy(draft_tokens: jax.Array, target_logits: jax.Array) -> Verdict:
  """Temperature 0: keep the longest prefix equal to the target's argmax; next token = the argmax after it.

  Args:
    draft_tokens: [B, G] int (the draft's argmax tokens).
    target_logits: [B, G + 1, V].
  """
  best = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, G + 1]
  match = draft_tokens == best[:, :-1]
  n = _leading_true(match)
  next_token = jnp.take_along_axis(best, n[:, None], axis=1)[:, 0]
  return Verdict(num_accepted=n, next_token=next_token, beta=match.astype(jnp.float32))


def residual_probs(p: jax.Array, q: jax.Array) -> jax.Array:
  """norm(max(0, p - q)) in float32, falling back to p where the residual has (almost) no mass. [..., V]."""
  r = jnp.maximum(p.astype(jnp.float32) - q.astype(jnp.float32), 0.0)
  mass = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(mass > RESIDUAL_FLOOR, r / jnp.where(mass > RESIDUAL_FLOOR, mass, 1.0), p)


def accept_sampled(key: jax.Array, draft_tokens: jax.Array, q: jax.Array, p: jax.Array) -> Verdict:
  """Leviathan et al.'s rejection rule: accept x_j while u_j < min(1, p_j(x_j) / q_j(x_j)).

  Args:
    key: PRNG key for this step (the row index is folded in per row).
    draft_tokens: [B, G] int, drawn from q.
    q: [B, G, V] float32, exactly the probabilities the draft tokens were drawn from.
    p: [B, G + 1, V] float32, the target's probabilities after the same warping.
  """
  accept_key, token_key = jax.random.split(key)
  batch, gamma = draft_tokens.shape
  p_draft = jnp.take_along_axis(p[:, :gamma], draft_tokens[..., None], axis=-1)[..., 0]  # [B, G]
  q_draft = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]  # [B, G]
  u = sampling.uniform(accept_key, (batch, gamma))
  n = _leading_true(u * q_draft < p_draft)  # u < p/q without dividing; q(x) > 0 since x was drawn from q.
  # The next token comes from the residual at the first rejection, or from p itself after full acceptance
  # (a zero q row makes the residual equal to p).
  q_ext = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)  # [B, G + 1, V]
  p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]  # [B, V]
  q_n = jnp.take_along_axis(q_ext, n[:, None, None], axis=1)[:, 0]
  next_token = sampling.sample(token_key, residual_probs(p_n, q_n))
  beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)
  return Verdict(num_accepted=n, next_token=next_token, beta=beta)
