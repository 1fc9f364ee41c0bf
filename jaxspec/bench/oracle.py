"""An oracle draft: a real draft's cost with a chosen acceptance rate. A benchmark tool, not library API.

The paper's speedups need alpha, which only trained pairs give; the costs need only the shapes. `OracleDecoder`
joins the two: every call runs a real decoder step (e.g. a T5-small-shaped T5 with random weights) in full, so it
costs exactly what that draft costs, then overrides the proposal. The token it proposes after loop position t
(the token at sequences[:, t + 1], generated token t) is the target's own greedy token there when
`accept_mask(seed, t, alpha)` holds, else a different token:

    greedy = greedy_tokens(target_decoder, target_params, ids, lengths, max_new_tokens + gamma + 1)
    draft = OracleDecoder(t5.T5Decoder(small_config))
    params = oracle_params(small_params, greedy, seeds, alpha)   # the loop's draft_params

Acceptance is decided per (row, generated position) by a hash of (row seed, position), so at temperature 0 the
loop runs the i.i.d. acceptance model of the paper's Theorem 3.8 at rate alpha: a position drafted again after an
earlier rejection gets the same answer, but its first answer was never seen (it came after the first rejection),
so the process stays i.i.d. Only temperature 0 is meaningful: when sampling, acceptance depends on p and q, not
on alpha.

The real logits are not dead code: the output is `where(vocab id == greedy token, +-BIG, real logits)`, which the
loop's argmax reads in full, so XLA must compute the whole draft step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.decoding.device import loop, sampling
from jaxspec.decoding import placement
from jaxspec.decoding.drafters import tree as tree_lib
from jaxspec.decoding.device.drafter import PlainDrafter, Proposal, TreeProposal
from jaxspec.decoding.settings import Tree
from jaxspec.errors import SettingsError
from jaxspec.decoding.drafters.model_drafter import ModelDrafter
from jaxspec.models.contract import Decoder

BIG = 1e9  # Above any real logit: the proposed token's logit (or minus it for a rejected position).
_MIX = (0x9E3779B1, 0x85EBCA77, 0x85EBCA6B, 0xC2B2AE35)  # Weyl constants, then murmur3's fmix32 multipliers.


def _uniform(seeds, positions, xp):
  """A uniform in [0, 1) per (seed, position): murmur3's finaliser over seed * a + position * b (uint32)."""
  u32 = xp.uint32
  x = xp.asarray(seeds).astype(u32) * u32(_MIX[0]) + xp.asarray(positions).astype(u32) * u32(_MIX[1])
  x = x ^ (x >> u32(16))
  x = x * u32(_MIX[2])
  x = x ^ (x >> u32(13))
  x = x * u32(_MIX[3])
  x = x ^ (x >> u32(16))
  return (x >> u32(8)).astype(xp.float32) * xp.float32(2.0 ** -24)


def accept_mask(seeds: jax.Array, positions: jax.Array, alpha: jax.Array) -> jax.Array:
  """Whether the oracle proposes the greedy token: seeds [B, 1] uint32, positions [B, T] int32 -> [B, T] bool."""
  return _uniform(seeds, positions, jnp) < alpha


def accept_mask_np(seeds: np.ndarray, positions: np.ndarray, alpha: float) -> np.ndarray:
  """`accept_mask` in numpy (the same bits), for tests and for the designed acceptance of a run."""
  with np.errstate(over="ignore"):
    return _uniform(seeds, positions, np) < np.float32(alpha)


def oracle_params(model_params, greedy: jax.Array, seeds: jax.Array, alpha: float) -> dict:
  """The oracle's parameter pytree (the loop's draft_params).

  Args:
    model_params: the wrapped decoder's parameters.
    greedy: [B, N] int32, the target's greedy tokens: N >= max_new_tokens + gamma + 1 covers every position the
      loop can draft (positions past N propose greedy[:, N - 1], whose acceptance is not controlled).
    seeds: [B] uint32, one per row: rows with different seeds accept at different positions.
    alpha: the acceptance rate, in [0, 1] (a runtime value: changing it does not recompile).
  """
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}.")
  return {"model": model_params, "greedy": jnp.asarray(greedy, jnp.int32),
          "seeds": jnp.asarray(seeds, jnp.uint32), "alpha": jnp.float32(alpha)}


@dataclasses.dataclass(frozen=True)
class OracleDecoder:
  """A `Decoder` that runs `inner`'s step for its cost and proposes the target's greedy token at rate alpha."""

  inner: Decoder

  @property
  def num_feature_layers(self) -> int:
    return self.inner.num_feature_layers

  @property
  def feature_size(self) -> int:
    return self.inner.feature_size

  def cache_axes(self):
    return self.inner.cache_axes()

  def prefill(self, params: dict, input_ids: jax.Array, input_lengths: jax.Array, cache_len: int, *,
              layers: tuple[int, ...] = (), encoder: bool = False):
    return self.inner.prefill(params["model"], input_ids, input_lengths, cache_len, layers=layers, encoder=encoder)

  def step(self, params: dict, cache, tokens: jax.Array, *, tree=None, layers: tuple[int, ...] = ()):
    """tokens [B, T] -> StepResult whose logits [B, T, V] float32 have the oracle's proposal as argmax (a chain;
    tree nodes are not positions of one sequence: the oracle drafts chains only)."""
    if tree is not None:
      raise ValueError("the oracle drafter drafts chains only (no token trees).")
    positions = cache.positions[:, None] + jnp.arange(tokens.shape[1])  # [B, T]: predicts generated token t
    res = self.inner.step(params["model"], cache, tokens, layers=layers)
    logits, cache = res.logits, res.cache
    greedy = params["greedy"]
    want = jnp.take_along_axis(greedy, jnp.clip(positions, 0, greedy.shape[1] - 1), axis=1)  # [B, T]
    value = jnp.where(accept_mask(params["seeds"][:, None], positions, params["alpha"]), BIG, -BIG)
    hit = jnp.arange(logits.shape[-1]) == want[..., None]  # [B, T, V]
    return res.replace(logits=jnp.where(hit, value[..., None].astype(logits.dtype), logits), cache=cache)


def plain_settings(target: Decoder, max_new_tokens: int) -> loop.LoopSettings:
  """Greedy plain decoding that never stops early (no EOS id), as the oracle's benchmarks run it."""
  return loop.LoopSettings(target=target, drafter=PlainDrafter(), gamma=0, max_new_tokens=max_new_tokens,
                           greedy=True, filtering=False, eos_ids=(-1,), pad_id=0)


def oracle_settings(target: Decoder, draft: OracleDecoder, gamma: int, max_new_tokens: int) -> loop.LoopSettings:
  """Greedy speculative decoding with the oracle draft, no EOS id (every row runs max_new_tokens)."""
  return dataclasses.replace(plain_settings(target, max_new_tokens), drafter=ModelDrafter(draft), gamma=gamma)


def decode(settings: loop.LoopSettings, target_params, draft_params, ids: jax.Array, lengths: jax.Array):
  """Prefill and loop as `jaxspec.generate` runs them; returns the final `LoopState` (blocked on)."""
  batch = ids.shape[0]
  target_cache, draft_cache, first = placement.PREFILL(settings, target_params, draft_params, ids, lengths)
  state = placement.RUN(settings, target_params, draft_params, target_cache, draft_cache, first,
               sampling.SamplingKnobs.create(0.0, 0, 1.0), jnp.zeros((batch,), jnp.uint32),
               jnp.arange(batch, dtype=jnp.int32))
  return jax.block_until_ready(state)


def greedy_tokens(target: Decoder, target_params, ids: jax.Array, lengths: jax.Array, n: int) -> jax.Array:
  """[B, n] int32: the target's greedy continuation (plain decoding, no EOS), the oracle's answer key."""
  state = decode(plain_settings(target, n), target_params, None, ids, lengths)
  return state.sequences[:, 1:1 + n]


# --- An oracle for every drafter (issue 32 item 3) ---------------------------------------------------------------


def drafter_params(inner_params, greedy: jax.Array, seeds: jax.Array, alpha: float = 0.0,
                   accepted: float = 0.0) -> dict:
  """The `OracleDrafter`'s parameter pytree (the loop's draft_params).

  Args:
    inner_params: the wrapped drafter's own (a draft model's weights, a head's {"head", "embed"}, None).
    greedy: [B, N] int32 the target's greedy tokens (`greedy_tokens`), N >= max_new_tokens + gamma + 1.
    seeds: [B] uint32, one per row.
    alpha: chains: each drafted token is accepted i.i.d. with this probability (a hash of row seed and
      position: `accept_mask`).
    accepted: trees: the mean number of drafts accepted per iteration (tau - 1: EAGLE-3's 6.1 tokens per
      iteration is accepted 5.1), in [0, gamma]; each iteration accepts floor(accepted) or one more (with
      probability its fractional part, a hash of row seed and the iteration's first position).
  Runtime values: changing alpha or accepted does not recompile.
  """
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}.")
  if accepted < 0:
    raise ValueError(f"accepted must be >= 0, got {accepted!r}.")
  return {"inner": inner_params, "greedy": jnp.asarray(greedy, jnp.int32), "seeds": jnp.asarray(seeds, jnp.uint32),
          "alpha": jnp.float32(alpha), "accepted": jnp.float32(accepted)}


def tree_accepted(seeds, positions, accepted: float, depth: int, xp=np):
  """Drafts a tree iteration accepts by design: floor(accepted) + (u < frac(accepted)), at most depth; seeds
  and positions (the iteration's first drafted position) broadcast. xp: numpy (tests) or jax.numpy."""
  base = xp.floor(xp.asarray(accepted, xp.float32))
  with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as in jax
    extra = _uniform(xp.asarray(seeds, xp.uint32) ^ xp.uint32(0x5BD1E995), positions, xp) < (accepted - base)
  return xp.minimum(base.astype(xp.int32) + extra.astype(xp.int32), depth)


def _other(want: jax.Array, noise: jax.Array, vocab_size: int) -> jax.Array:
  """A token != want (same shape) that depends on noise (the inner drafter's real output: keeps it live)."""
  noise = jnp.abs(noise.astype(jnp.int32)) % max(vocab_size - 1, 1)
  return ((want + 1 + noise) % vocab_size).astype(jnp.int32)


def _spine(nodes: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
  """The oracle's tree topology over N = nodes + 1 nodes: a chain (the spine) of min(depth, nodes) nodes under
  the root, every further node a leaf hung under the spine's nodes in turn (depth <= `depth`). Returns
  (parents [N], depths [N]) int32, parents before children."""
  spine = min(depth, nodes)
  parents, depths = [-1] + list(range(spine)), list(range(spine + 1))
  for j in range(nodes - spine):
    parent = j % spine  # depth <= spine <= depth
    parents.append(parent)
    depths.append(depths[parent] + 1)
  return np.asarray(parents, np.int32), np.asarray(depths, np.int32)


@dataclasses.dataclass(frozen=True)
class OracleDrafter:
  """Any drafter (a draft model's `ModelDrafter`, a feature head's `HeadDrafter` / `CrossHeadDrafter`, prompt
  lookup's `NGramDraft`; chains and trees) with its real proposal step and cost, and designed acceptance.

  Each iteration runs `inner`'s own `propose` (or `propose_tree`) in full, then replaces its tokens:
    - chains: draft j of a row (generated position t = lengths - 1 + j) becomes the target's greedy token there
      when `accept_mask(seed, t, alpha)` holds, else another token: the loop accepts i.i.d. at rate alpha (as
      `OracleDecoder`); every row proposes what it may (gamma, or its schedule's limit);
    - trees: the tree keeps inner's node count (the verify call's cost) but takes a designed topology (`_spine`:
      a chain of depth gamma under the root, the other nodes leaves under it; a random-weight drafter's own tree
      would be too shallow to reach a designed depth), the spine's first `tree_accepted(...)` nodes the greedy
      tokens, every other node another token: the loop accepts that many drafts per iteration.
  The replacement tokens are computed from inner's tokens (and a tree's parents and ancestor counts), so XLA
  cannot drop inner's work. Everything else (init, settle, idle, feature layers, the encoder) is inner's:
  `settle` gets inner's own proposal back. Greedy output equals plain decoding, as the target verifies its own
  greedy tokens. Temperature 0 only (sampling accepts by p and q, not by design): SettingsError otherwise.

      drafter = OracleDrafter(ModelDrafter(small.decoder()), vocab_size=target.config.vocab_size)
      params = drafter_params(small.params, greedy_tokens(...), seeds, alpha=0.75)
  """

  inner: Any
  vocab_size: int

  @property
  def may_find_nothing(self) -> bool:
    return self.inner.may_find_nothing

  @property
  def default_cost(self) -> float:
    return self.inner.default_cost

  @property
  def feature_layers(self) -> tuple[int, ...]:
    return self.inner.feature_layers

  @property
  def reads_encoder(self) -> bool:
    return self.inner.reads_encoder

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None):
    return self.inner.init(params["inner"], input_ids, input_lengths, cache_len, features=features, encoder=encoder)

  def idle(self, state, history, static):
    p = self.inner.idle(state, history, static)
    return Proposal(tokens=p.tokens, counts=p.counts, q=None, after=p)

  def state_axes(self):
    return self.inner.state_axes()

  def settle(self, verdict):
    params = verdict.params
    return self.inner.settle(verdict._replace(proposal=verdict.proposal.after,
                                              params=None if params is None else params["inner"]))

  @staticmethod
  def _greedy_only(static) -> None:
    if not static.greedy:
      raise SettingsError("the oracle drafter designs acceptance at temperature 0 only.")

  def propose(self, request):
    params, history, limit, static = request.params, request.history, request.limit, request.static
    self._greedy_only(static)
    p = self.inner.propose(request._replace(params=params["inner"]))
    gamma, greedy = static.gamma, params["greedy"]
    positions = history.lengths[:, None] - 1 + jnp.arange(gamma)  # [B, G] generated positions of the drafts
    want = jnp.take_along_axis(greedy, jnp.clip(positions, 0, greedy.shape[1] - 1), axis=1)
    hit = accept_mask(params["seeds"][:, None], positions, params["alpha"])
    tokens = jnp.where(hit, want, _other(want, p.tokens, self.vocab_size))
    counts = None
    if p.counts is not None:  # Every row proposes what it may, whatever inner found.
      counts = jnp.where(history.done, 0, gamma if limit is None else limit).astype(jnp.int32)
    return Proposal(tokens=tokens, counts=counts, q=None, after=p)

  def propose_tree(self, params, state, history, static, knobs, keys):
    self._greedy_only(static)
    p = self.inner.propose_tree(params["inner"], state, history, static, knobs, keys)
    batch, n = p.tokens.shape
    parents, depths = _spine(n - 1, static.gamma)
    spine = min(static.gamma, n - 1)
    parents = jnp.broadcast_to(jnp.asarray(parents), (batch, n))
    depths = jnp.broadcast_to(jnp.asarray(depths), (batch, n))
    greedy = params["greedy"]
    first = history.lengths - 1  # [B] generated position of depth 1
    positions = first[:, None] + depths - 1  # [B, N]
    want = jnp.take_along_axis(greedy, jnp.clip(positions, 0, greedy.shape[1] - 1), axis=1)
    k = tree_accepted(params["seeds"], first, params["accepted"], spine, jnp)  # [B]
    on_spine = (jnp.arange(n) >= 1) & (jnp.arange(n) <= spine)
    hit = on_spine[None] & (depths <= k[:, None])
    noise = p.tokens + p.parents + p.ancestors.sum(axis=2, dtype=jnp.int32)  # inner's whole tree stays live
    tokens = jnp.where(hit, want, _other(want, noise, self.vocab_size))
    tokens = tokens.at[:, 0].set(p.tokens[:, 0])  # the root is the loop's own last token
    return TreeProposal(tokens=tokens, parents=parents, depths=depths,
                                 ancestors=tree_lib.ancestors_of(parents, spine), after=p, siblings=None)


def drafter_settings(target: Decoder, drafter: OracleDrafter, gamma: int, max_new_tokens: int,
                     tree: Tree | None = None) -> loop.LoopSettings:
  """Greedy speculative decoding with an oracle drafter (chain, or a tree of this shape and depth gamma), no
  EOS id: every row runs max_new_tokens."""
  return dataclasses.replace(plain_settings(target, max_new_tokens), drafter=drafter, gamma=gamma, tree=tree)


def measured_acceptance(stats, gamma: int) -> dict:
  """What a run's DecodeStats (host arrays or device) measured: alpha (the rate over judged draft positions,
  `DecodeStats` beta at temperature 0) with its binomial standard error, and tokens per iteration (accepted + 1
  per target call, before max_new_tokens cuts)."""
  beta_sum, beta_count = float(np.sum(stats.beta_sum)), int(np.sum(stats.beta_count))
  alpha = beta_sum / max(beta_count, 1)
  iterations, accepted = int(np.sum(stats.iterations)), int(np.sum(stats.accepted))
  return {"alpha": alpha, "alpha_stderr": float(np.sqrt(max(alpha * (1 - alpha), 1e-12) / max(beta_count, 1))),
          "judged_positions": beta_count, "iterations": iterations,
          "accepted_per_iteration": accepted / max(iterations, 1),
          "tokens_per_iteration": (accepted + iterations) / max(iterations, 1)}
