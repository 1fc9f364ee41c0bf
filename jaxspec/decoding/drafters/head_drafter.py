"""`HeadDrafter`: a feature head (EAGLE-3, `jaxspec.models.eagle3`) drafts from the target's own hidden states
(device/drafter.py's `Drafter`).

    out = jaxspec.generate(target, prompts, jaxspec.Speculation(jaxspec.load(head_dir), gamma=3))

The head is one decoder layer over [embedding of token p + 1, fused target features of position p] that predicts
token p + 2 (docs/heads.md, "Alignment"); at later draft steps its own pre-norm output stands in for the features.
Its weights come as params = {"head": the head's parameters, "embed": [V, H] the table it embeds tokens with (its
own, else the target's: `eagle3.embedding_table`)}. Its `feature_layers` (static) make the loop ask the target's
`prefill` / `step` for those layers' features; the features reach `init` (the prompt's) and `settle` (the verified block's).

Loop positions as in loop.py: row b holds L = lengths[b] tokens, position 0 the loop's first token (a
decoder-only prompt's last token), the last one not yet fed to the target. The head's cache counts the same
positions (offsets = prompt length - 1, as the target's); its entry at position p pairs the target's feature of p
with token p + 1. Invariants at the top of an iteration, for EVERY row (finished, resting and failed ones too):
  - the head's cache holds the entries of positions < L - 1 (`cache.positions == L - 1`), each written from the
    target's REAL features of that position (never from the head's own outputs);
  - `hidden` [B, H] is the head's pre-norm output at entry L - 2: its logits (`Eagle3Head.logits`) are the head's
    distribution for token L, the first draft. (A one-token prompt has no entry -1: its first draft is drawn from
    junk, which costs acceptance, never exactness.)
Entries at positions >= L - 1 are stale: attention masks keys by position and later writes overwrite them.

propose: x_1 from the logits of `hidden`; then up to k - 1 steps, step j writing the chain entry at position
  L - 2 + j = (pre-norm output of the previous entry, x_j) and drawing x_{j+1} from its logits. Every token is
  drawn with `sampling.draw` from the head's logits over the full target vocabulary (-inf outside the draft
  vocabulary t2d: q is 0 there, so the rejection rule stays lossless). Under schedule "constant" every unfinished
  row drafts gamma (a `lax.scan`); with `limit` (heuristic / adaptive) row b drafts at most limit[b] and stops after
  a token whose distribution's top probability is below draft_confidence (a `lax.while_loop` that steps while some
  row still drafts, as model_drafter.py does).
settle: the chain entries were speculative: the cache goes back to L - 1 (the iteration's start) and ONE call
  (`Eagle3Head.feed`, no logits) writes the W positions the target just verified, L - 1 .. L - 2 + W, from the
  target's features [B, W, F] and the emitted tokens; the row keeps emit[b] of them (positions < L' - 1 for its new
  length L' = L + emit) and the pre-norm output of entry L' - 2 as its new `hidden`. Entries past emit (rejected
  drafts, junk) are stale. A resting iteration verifies 1 position (W = 1): the head is fed it there, so a row that
  rested is never behind, and no catch-up or re-feed is ever needed.
idle: nothing (the resting iteration's settle feeds the one verified position).

Trees (`propose_tree`, `Speculation(head, gamma=D, tree=jaxspec.Tree(K, N))`: EAGLE-2's dynamic tree from an
EAGLE-3 head, `tree.draft_tree`'s builder). The tree's root is the loop's last token L - 1; a node of depth d holds
the token at position L - 1 + d, and the head entry that proposes its children sits at position L - 2 + d and
pairs the pre-norm output of its parent's entry (for d = 1: `hidden`, the entry L - 2) with the node's token, as a
chain's step d would. Depth 1 is the top_k of `hidden`'s logits (draws when sampling); for each depth d < D the
beam's K nodes are fed in ONE head call (`Eagle3Head.step` with `tree`: positions L - 2 + d for RoPE, written at slots L - 1 + K (d - 1) .., each
attending to the cached entries < L - 1 and to the entries of its own ancestors among the beams fed before, the
`contract.tree_attention` mask), whose logits rank the next depth's candidates (`tree.draft_logprobs` of the
logits over the full target vocabulary, -inf outside t2d; any ranking is exact, the tree depends on the head
only). The K (D - 1) tree entries are speculative. The loop verifies the tree with the target's
`step(..., tree=..., layers=...)` and passes `settle` the features of the accepted path's nodes in path order ([B, G + 1, F];
node path[j] sits at position L - 1 + j) with the path's block (its drafted tokens, then the next token): the
chain's inputs for the same accepted tokens, so `settle` is the chain's and the invariants above hold for trees
unchanged: the cache goes back to L - 1 (every tree entry dropped: later writes overwrite them, attention masks
them by position meanwhile) and the path's positions are re-fed from the target's REAL features.

Exactness: every draft depends only on the sequence so far and the target's features of already verified
positions (known before the target scores the drafts), and q is exactly what each token was drawn from (a tree's
nodes are deterministic candidates: tree_verify.py).

Shapes: B batch, G = gamma, V target vocabulary, H the head's hidden size, F = 3 * target hidden size, W the
verify call's positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding.drafters import chain
from jaxspec.models.contract import TreeNodes
from jaxspec.models.eagle3 import Eagle3Cache, Eagle3Head, HeadInput

# c for a feature head when Speculation.draft_cost is None: one decoder layer and an lm_head against the
# target's whole stack (EAGLE-3 on an 8B / 32-layer target: a few percent of a verify call).
HEAD_DRAFT_COST = 0.05


@struct.dataclass
class HeadState:
  """The head's state in the loop (see the module docstring's invariants)."""

  cache: Eagle3Cache  # entries of positions < L - 1, from the target's real features.
  hidden: jax.Array  # [B, H] the pre-norm output of entry L - 2 (the first draft's logits come from it).


@dataclasses.dataclass(frozen=True)
class HeadDrafter(chain.LearnedDrafter):
  """A feature head behind the `Drafter` protocol (hashable: part of the loop's static settings). Propose, idle
  and the tree's skeleton are `chain.LearnedDrafter`'s; this class gives the head's first logits, steps and beam.

  head: the head bound to its config; feature_layers: the target's feature indices it fuses (from
  `eagle3.check_fits`); vocab_size: the target's vocabulary (the logits' and q's last axis).
  """

  head: Eagle3Head
  feature_layers: tuple[int, ...]
  vocab_size: int
  may_find_nothing: bool = False
  default_cost: float = HEAD_DRAFT_COST
  reads_encoder: bool = False

  def __post_init__(self):
    if not self.feature_layers:
      raise ValueError("HeadDrafter needs the target feature layers it reads (eagle3.check_fits gives them).")
    if self.vocab_size != self.head.config.vocab_size:
      raise ValueError(f"HeadDrafter: vocab_size {self.vocab_size} differs from the head's "
                       f"{self.head.config.vocab_size}.")

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None):
    """The head's prefill from the prompt's features [B, S', F] (S' = S for a decoder-only target; 0 for T5,
    whose decoder starts empty: an empty cache and a zero `hidden`)."""
    head_params = params["head"]
    batch = input_ids.shape[0]
    if features.shape[1] == 0:
      dtype = head_params["fc"].dtype
      cache = self.head.init_cache(batch, cache_len, dtype)
      return HeadState(cache=cache, hidden=jnp.zeros((batch, self.head.config.hidden_size), dtype))
    out = self.head.prefill(params, HeadInput(input_ids, self.head.fuse(head_params, features)), input_lengths,
                            cache_len)
    cache, prenorm = out.cache, out.features
    last = jnp.clip(input_lengths - 2, 0, None).astype(jnp.int32)  # entry L - 2 of the loop: the prompt's n - 2
    return HeadState(cache=cache, hidden=jnp.take_along_axis(prenorm, last[:, None, None], axis=1)[:, 0])

  def state_axes(self):
    return HeadState(cache=self.head.cache_axes(), hidden=("batch", "embed"))

  def settle(self, verdict):
    """Re-feeds the verified positions with the target's real features (the module docstring)."""
    after: HeadState = verdict.proposal.after
    params, features, block, emit = verdict.params, verdict.features, verdict.block, verdict.emit
    width = features.shape[1]
    cache = after.cache.rollback(verdict.history.lengths - 1)  # the chain's entries were speculative
    g = self.head.fuse(params["head"], features)  # [B, W, H]
    with jax.named_scope("draft_step"):
      res = self.head.step(params, cache, HeadInput(block[:, :width], g))  # its logits are never read
    prenorm, cache = res.features, res.cache
    last = jnp.clip(emit - 1, 0, width - 1)
    hidden = jnp.where((emit > 0)[:, None], jnp.take_along_axis(prenorm, last[:, None, None], axis=1)[:, 0],
                       after.hidden)
    return HeadState(cache=cache.rollback(verdict.lengths - 1), hidden=hidden)

  def _call(self, params: Any, cache: Eagle3Cache, hidden: jax.Array, tokens: jax.Array,
            tree_nodes: tuple[jax.Array, jax.Array] | None = None) -> tuple[jax.Array, jax.Array, Eagle3Cache]:
    """The head's proposal call, shared by chains and trees: T entries (hidden [B, T, H], tokens [B, T]) ->
    (logits [B, T, V], pre-norm outputs [B, T, H], cache). tree_nodes None: a chain's entries at consecutive
    positions (`Eagle3Head.step`); (depths [B, P + T], ancestors [B, T, P + T]): tree nodes
    (`Eagle3Head.step` with `tree`)."""
    with jax.named_scope("draft_step"):
      res = self.head.step(params, cache, HeadInput(tokens, hidden),
                           tree=None if tree_nodes is None else TreeNodes.of(*tree_nodes))
    return res.logits, res.features, res.cache

  def _first(self, params: Any, state: HeadState) -> jax.Array:
    """[B, V] the logits of the first draft (from the pre-norm output of entry L - 2)."""
    return self.head.logits(params["head"], state.hidden[:, None])[:, 0]

  # chain.LearnedDrafter's hooks: no catch-up (the head's cache holds every entry before L - 1 after settle).

  def _begin(self, params, state, history, static, needed, variable, refeed):
    """(the first draft's logits from `hidden`, carry (cache, hidden [B, H]), nothing)."""
    return self._first(params, state), (state.cache, state.hidden), None

  def _step(self, params: Any):
    """The chain's step (chain.Step): one entry per row, carry (cache, hidden [B, H]), token [B]."""
    def step(carry, token):
      cache, hidden = carry
      logits, prenorm, cache = self._call(params, cache, hidden[:, None], token[:, None])
      return logits[:, 0], (cache, prenorm[:, 0])
    return step

  def _drafted(self, state, carry, begun, steps):
    cache, _ = carry
    return state.replace(cache=cache)

  def _rested(self, state):
    return state

  def _vocab(self, params, state, history):
    return self.vocab_size

  def _tree_carry(self, carry):
    """A tree's carry: (cache, prenorm [B, K', H] of the previous beam's entries; K' = 1 before the first call)."""
    cache, hidden = carry
    return cache, hidden[:, None]

  def _beam_step(self, params, rank):
    """EAGLE-2's beam step (the module docstring, "Trees"): each beam node's entry pairs the pre-norm output of
    its parent's entry (`hidden` for a depth-1 node) with its own token; each depth fed once (`_call` with the
    tree's depths and ancestors)."""
    def beam_step(carry, tokens, depths, ancestors):
      cache, previous = carry
      k, fed = tokens.shape[1], depths.shape[1] - tokens.shape[1]
      if fed == 0:  # depth 1: every node's parent is the root, whose "entry" is L - 2 (`hidden`)
        hidden = jnp.broadcast_to(previous, previous.shape[:1] + (k,) + previous.shape[2:])
      else:  # the parent of each node: the one previous-beam node (the last K fed) among its ancestors
        parent = jnp.argmax(ancestors[:, :, fed - k:fed], axis=2)  # [B, K]
        hidden = jnp.take_along_axis(previous, parent[:, :, None], axis=1)
      logits, prenorm, cache = self._call(params, cache, hidden, tokens, (depths, ancestors))
      return rank(logits), (cache, prenorm)
    return beam_step
