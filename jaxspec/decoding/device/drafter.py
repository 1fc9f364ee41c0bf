"""The `Drafter` protocol: what the decoding loop asks of anything that proposes tokens for the target to verify.

It lives beside the loop that calls it (the consumer owns the interface): device/ imports nothing of drafters/,
and every drafter (decoding/drafters/) imports this module. The loop (loop.py) knows no drafter by kind. Each iteration it calls, for the batch:

    proposal = drafter.propose(DraftRequest(params, state, history, limit, static, knobs, confidence, keys,
                                            some_row_drafts))
      # or, in an iteration in which the batch rests (fallback): proposal = drafter.idle(state, history, static)
    ... the target verifies proposal.tokens in one call, the loop emits block[b, :emit[b]] per row ...
    state = drafter.settle(Verdict(proposal, history, lengths, accepted, block, emit, params, features))

and once per call, before the loop, `state = drafter.init(params, input_ids, input_lengths, cache_len,
features=...)`. The
drafter's `state` is its own pytree (a draft model's cache, the prompt-lookup context, nothing for plain
decoding); the loop only carries it. Implementations, one module each of decoding/drafters/:

  - `PlainDrafter` (below): proposes nothing; gamma is 0 and the loop is plain autoregressive decoding;
  - `model_drafter.ModelDrafter`: a smaller model of the same tokenizer (the paper's drafter);
  - `ngram.NGramDrafter` (from the `jaxspec.NGramDraft` setting): prompt lookup, proposals copied from the context (deterministic: q is one-hot);
  - `head_drafter.HeadDrafter`: a feature head (EAGLE-3) reading the target's hidden states.

Trees. Every drafter but `PlainDrafter` proposes a token tree instead of a chain with `Speculation(tree=
jaxspec.Tree(top_k, nodes))`: `Drafter.propose_tree` (a draft model's and a feature head's EAGLE-2 dynamic tree,
prompt lookup's matches as branches).

Features. A drafter whose static `feature_layers` is non-empty reads the target's hidden states of those layers
(`jaxspec.models.contract.Decoder`'s `layers`): the loop's prefill asks the target's `prefill` for them and passes
the prompt's features [B, S', F] to `init`, and each verify call (`step(..., layers=feature_layers)`) returns the
features [B, W, F] of the W positions fed (W = gamma + 1, or 1 in a resting iteration), which go to `settle`. In a
tree iteration `settle` gets the features of the accepted path's nodes in path order ([B, gamma + 1, F], root
first: what a chain's call gives for the same accepted tokens). For every other drafter (`feature_layers == ()`)
the target's calls collect nothing and compile as plain ones; features are None.

Encoder output. A drafter with a static `reads_encoder = True` (a T5 target's feature head,
cross_head_drafter.py) also reads the encoder-decoder target's encoder output: the loop's prefill asks the
target's `prefill(..., encoder=True)` for it and passes `encoder=(encoded [B, S, D], mask [B, S])` to `init`, once
per input. The loop's iterations are unchanged.

A drafter is a frozen dataclass of static settings (hashable: it is part of the loop's static settings); its
weights, if any, come in `params`. To add one: a module of decoding/drafters/ with a frozen dataclass implementing
these methods and a factory, one entry in `drafters/registry.KINDS`, its unit tests (tests/decoding/), and the exactness
and lossless-sampling tests run with it (docs/drafters.md).

What keeps the output exact (REFERENCE.md): a proposal may depend on anything known before the target scores it
(the context, the drafter's own probabilities, the rows' past verdicts), never on the verdict it is about to get;
`q` must be exactly the distribution each token was drawn from, after the same warping as the target's.

Shapes: B batch, G = gamma (the most tokens a row drafts), V vocabulary, N the loop's sequence buffer.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding.device.sampling import SamplingKnobs

if TYPE_CHECKING:
  from jaxspec.decoding.settings import Tree


@dataclasses.dataclass(frozen=True)
class ProposalSettings:
  """The loop's static settings that shape a proposal."""

  gamma: int  # The most tokens a row drafts per iteration.
  cache_len: int  # Positions per row a drafter's cache holds from the loop's first token on.
  greedy: bool  # Temperature 0: drafts are argmaxes, q is not needed.
  filtering: bool  # Top-k / top-p active: the same warping as the target's.
  tree: Tree | None = None  # A token tree of this shape and depth gamma (`Drafter.propose_tree`); None: chains.


@struct.dataclass
class History:
  """What the loop knows at the top of an iteration (loop.py's invariants)."""

  sequences: jax.Array  # [B, N] int32: the loop's first token, then every token emitted so far.
  lengths: jax.Array  # [B] int32 tokens in `sequences` (the last one not yet fed to the target).
  done: jax.Array  # [B] bool finished rows (frozen: whatever they propose is ignored).

  @property
  def last(self) -> jax.Array:
    """[B] int32 each row's last token (not yet fed to the target: the next verify call's first token)."""
    return jnp.take_along_axis(self.sequences, (self.lengths - 1)[:, None], axis=1)[:, 0]


@struct.dataclass
class Proposal:
  """One iteration's drafts."""

  tokens: jax.Array  # [B, G] int32 proposed tokens (junk at positions >= counts).
  counts: jax.Array | None  # [B] int32 tokens each row really proposed (k <= G); None: every row proposed G.
  q: jax.Array | None  # [B, G, V] float32 distributions the tokens were drawn from; None when they are
  #                      deterministic (q one-hot on each token: prompt lookup) or greedy (argmax on both sides).
  after: Any  # The drafter's state after proposing, as its `settle` reads it.

  @classmethod
  def nothing(cls, history: History, static: ProposalSettings, after: Any, counts: bool = True) -> "Proposal":
    """A proposal of nothing that leaves the drafter's state as `after` (every count 0; counts=False: None, for a
    drafter whose gamma is 0): what `idle` returns, and a variable-length draft when no row drafts."""
    batch = history.lengths.shape[0]
    return cls(tokens=jnp.zeros((batch, static.gamma), jnp.int32),
               counts=jnp.zeros((batch,), jnp.int32) if counts else None, q=None, after=after)


class DraftRequest(NamedTuple):
  """What `Drafter.propose` gets each iteration (one value: implementations read the fields they need)."""

  params: Any  # The drafter's weights (`DraftSource.params`; None without).
  state: Any  # The drafter's state (from `init`, then `settle`).
  history: History  # The loop's tokens at the top of the iteration.
  limit: jax.Array | None  # [B] int32 in [0, G]: the most tokens row b drafts; None: G for every unfinished row
  #                          (schedule "constant").
  static: ProposalSettings  # Static: gamma, cache_len, greedy, filtering, the tree.
  knobs: SamplingKnobs  # The warping (temperature, top-k, top-p) the target's distribution gets too.
  confidence: jax.Array  # [] float32: a row may stop after a token whose top probability is below it (0 = off).
  keys: jax.Array  # [B] this iteration's draft keys.
  some_row_drafts: bool  # Static: some limit is > 0, so no `lax.cond` around the drafting is needed.


class Verdict(NamedTuple):
  """What `Drafter.settle` gets after the target verified a proposal (one value)."""

  proposal: Proposal  # What `propose` (or `idle`, or `propose_tree`) returned; its `after` is the state to settle.
  history: History  # The iteration's start.
  lengths: jax.Array  # [B] int32 the new lengths.
  accepted: jax.Array  # [B] int32 drafts kept (n).
  block: jax.Array | None  # [B, G + 1] int32 the emitted tokens, of which emit[b] count for row b.
  emit: jax.Array | None  # [B] int32.
  params: Any = None  # The drafter's weights.
  features: jax.Array | None = None  # [B, W, F] the target's features of the W positions the verify call fed (the
  #   last token, then the drafts: position lengths - 1 + j of history for j < W; after a tree, W = G + 1 and entry
  #   j is the accepted path's node j, junk past it; None without feature_layers).


@struct.dataclass
class SampledSiblings:
  """The children DRAWN from q at every expanded node of a tree (`tree.draft_tree` with keys), kept in the tree or
  not, for `device.tree_verify.accept_tree_recursive`. E = 1 + K (D - 1) expanded nodes (the root, then each depth's
  beam), in pool order."""

  nodes: jax.Array  # [B, E] int32 tree node of each expanded node (-1: not kept in the tree).
  children: jax.Array  # [B, E, K] int32 its K draws without replacement from q, in draw order.
  child_nodes: jax.Array  # [B, E, K] int32 tree node of each draw (-1: dropped by the final rerank).
  q: jax.Array  # [B, E, V] float32 the draft's distribution at the expanded node (the draws came from it).


@struct.dataclass
class TreeProposal:
  """One iteration's tree of drafts per row (what a tree drafter's `propose_tree` returns to the loop)."""

  tokens: jax.Array  # [B, N] int32 node tokens; node 0 is the root, the loop's last token (not a draft).
  parents: jax.Array  # [B, N] int32 parent node of each node (-1 at the root).
  depths: jax.Array  # [B, N] int32 (0 at the root; the deepest node has depth <= gamma).
  ancestors: jax.Array  # [B, N, N] bool (a node is its own ancestor).
  after: Any  # The drafter's state after proposing, as its `settle` reads it.
  siblings: SampledSiblings | None = None  # Children drawn from q (a draft model sampling), else None: the
  #                                          children are deterministic candidates (greedy, prompt lookup).


@runtime_checkable
class Drafter(Protocol):
  """Proposes tokens for the target to verify (see the module docstring)."""

  # A row asked to draft may propose nothing (a lookup without a match): the loop then picks the verify call's
  # width per iteration. False: a row asked to draft proposes >= 1 token, and a batch that rests is known before
  # drafting (the loop runs resting iterations in a loop of their own).
  may_find_nothing: bool
  # c, the cost of one proposed token relative to a verify call, when Speculation.draft_cost is None.
  default_cost: float
  # The target feature layers the drafter reads (`Decoder` feature indices); () for none (see the module docstring).
  feature_layers: tuple[int, ...]
  # Whether the drafter also reads an encoder-decoder target's encoder output (a T5 target's feature head): the
  # loop's prefill then asks the target for it (`Decoder.prefill(..., encoder=True)`) and passes it to `init`.
  reads_encoder: bool

  def init(self, params: Any, input_ids: jax.Array, input_lengths: jax.Array, cache_len: int,
           features: jax.Array | None = None, encoder: tuple[jax.Array, jax.Array] | None = None) -> Any:
    """The state before the first iteration. input_ids [B, S] right-padded, input_lengths [B]; features
    [B, S', F] the target's features of the prompt positions it prefilled (None without feature_layers);
    encoder (encoded [B, S, D], mask [B, S] bool) the target's encoder output (None unless reads_encoder)."""
    ...

  def propose(self, request: DraftRequest) -> Proposal:
    """Up to request.limit[b] tokens for row b (`DraftRequest`: the params, the state, the history, the limit,
    the static settings, the knobs, the confidence, the keys, whether some row drafts)."""
    ...

  def idle(self, state: Any, history: History, static: ProposalSettings) -> Proposal:
    """A proposal of nothing (every count 0) that leaves the state as it is: an iteration in which the batch
    rests."""
    ...

  def state_axes(self) -> Any:
    """The logical axis names of every array of the state `init` returns: the state's pytree with a tuple of names
    in place of each array ("batch" the rows; a model's cache as its `Decoder.cache_axes`), None for no state.
    A slot engine reads it to write one row's state and to split the rows over a mesh (never from shapes)."""
    ...

  def settle(self, verdict: Verdict) -> Any:
    """The state after verification (`Verdict`: the proposal, the iteration's history, the new lengths, the
    drafts accepted, the emitted block and counts, the params, the target's features)."""
    ...

  def propose_tree(self, params: Any, state: Any, history: History, static: ProposalSettings, knobs: SamplingKnobs,
                   keys: jax.Array) -> TreeProposal:
    """With `Speculation(tree=jaxspec.Tree(...))` (schedule "constant": every row drafts its whole tree) the loop
    calls this instead of `propose` each iteration, verifies every node in one `step(..., tree=...)` call of the
    target and passes the usual `settle` a proposal whose `after` is `TreeProposal.after`, with `accepted` the
    drafted nodes kept on the accepted path.

    A tree of static.tree.nodes + 1 nodes per row (the root first: the loop's last token), depth <= gamma,
    parents before children; chosen from the drafter's information only (never the target's verdict), which
    keeps every acceptance rule exact (tree_verify.py). Siblings are deterministic candidates (greedy; prompt
    lookup), or, when sampling, DRAWS from the drafter's q in draw order, recorded with q in the proposal's
    `siblings` (`tree.draft_tree` with `keys`) so that the target verifies them by recursive rejection sampling."""
    ...


@dataclasses.dataclass(frozen=True, eq=False)
class DraftSource:
  """What a speculation drafts with: the loop's drafter and the parameters it reads, placed on a target's mesh one
  way for every kind (`placement.draft_params_on`). `registry.draft_source` makes it from the user's
  setting.

  drafter: the loop's `Drafter` (static: part of the loop's settings).
  params: the pytree passed to the drafter as `params` (a draft model's weights, a feature head's {"head",
    "embed"}; None for prompt lookup and plain decoding).
  model: the draft model when `params` are its weights (its caches and weights are then planned and placed by
    its family's axes, under DRAFT_RULES unless it already is on the target's mesh), else None (the params are
    replicated on a mesh).
  owner: the user's object the params came from (the draft Model, the FeatureHead): a copy placed on a mesh is
    kept beside it for later calls (never stored on it).
  """

  drafter: Drafter
  params: Any = None
  model: Any = None
  owner: Any = None


@dataclasses.dataclass(frozen=True)
class PlainDrafter:
  """Proposes nothing: with it (and gamma 0) the loop is plain autoregressive decoding, through the same code."""

  may_find_nothing: bool = False
  default_cost: float = 0.0
  feature_layers: tuple[int, ...] = ()
  reads_encoder: bool = False

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None):
    return None

  def state_axes(self):
    return None

  def propose(self, request):
    return self.idle(request.state, request.history, request.static)

  def idle(self, state, history, static):
    return Proposal.nothing(history, static, state, counts=False)

  def settle(self, verdict):
    return verdict.proposal.after

  def propose_tree(self, params, state, history, static, knobs, keys):
    raise ValueError("plain decoding drafts no token tree (Speculation(tree=...) needs a draft).")
