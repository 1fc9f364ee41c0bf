"""The decoding loop: one `lax.while_loop` holding drafting, batched verification and per-row acceptance (for
draft models under "heuristic" / "adaptive", two inner loops within it: drafting and resting iterations).

The loop sees the target only through `jaxspec.models.contract.Decoder`: one `prefill` (with the features the
drafter's static `feature_layers` names, and the encoder output when its `reads_encoder`) and one `step`, the
iteration's one scoring call (`_score`: a chain, or a tree's nodes with `tree`; with the drafter's features), one
verification entry point for chains and trees (`_verify`), and its
cache's `positions` / `rollback`, and the drafter only through `drafter.Drafter` (init, propose, idle, settle): it
imports no model family and knows no drafter by kind. Its own tokens live in `sequences`: position 0 holds the
first token the prefill returned (T5's decoder start token, a decoder-only prompt's last token), then the
generated tokens; a cache's `positions` count how many of them it has fed.

The loop step is public: `iteration(settings, target_params, draft_params, knobs, spec, stream_id, kind, state)`
is one iteration over a `LoopState` and `IterationKind(rests, width)` says what its compiled body does; `run`'s
while_loop and the slot engine's insert and step programs (device/slots.py) run this same function.

Each iteration, for every unfinished row:
  1. the drafter proposes k <= gamma tokens (a draft model: drafters/model_drafter.py; prompt lookup:
     drafters/ngram.py; nothing: drafter.PlainDrafter, gamma 0): at most gamma with schedule "constant", else
     at most the batch's length from its schedule and fallback (schedules.py), and fewer where the drafter stops
     early (draft confidence, a lookup without a match);
  2. the target scores [last token, x_1..x_gamma] in ONE call of gamma + 1 positions (1 position when no row
     drafted anything: the iteration is then plain decoding). Under "heuristic" / "adaptive", with a drafter that
     proposes whenever asked, the loop has two inner loops (`LoopSettings.phased`): drafting iterations (always
     gamma + 1 positions) while the batch drafts, resting ones (1 position, `Drafter.idle`) while it rests; a
     drafter that may find nothing (lookup) has the width picked per iteration with a `lax.cond`;
  3. `verify` keeps the longest acceptable prefix of each row's k drafts and picks the correction or bonus token;
  4. up to k + 1 tokens are written (cut at the first EOS and at max_new_tokens; the slot engine's rows may
     ignore EOS or forbid it before min_tokens: LoopState.ignore_eos / min_tokens), the target's cache is rolled
     back per row by setting its positions, the drafter settles its state (`Drafter.settle`), and with
     `streaming` the new tokens go to the host (streaming.py).
With gamma == 0 and `PlainDrafter` this is plain autoregressive decoding through the same model code and caches.

Invariants at the top of an iteration (row b, L = lengths[b] tokens in sequences[b], first token included):
  - the last token sequences[b, L-1] has not been fed to the target: target_cache.positions[b] == L - 1;
  - a draft model has fed positions < its cache's positions[b] <= L - 1 (L - 2 after it accepted all its drafts:
    it never saw the last one, REFERENCE.md pitfall 1; less after iterations in which it drafted nothing);
    the lookup context holds the input and all L tokens; a feature head holds the entries of positions < L - 1,
    each from the target's real features (head_drafter.py);
  - choices of k use only what is known before the target scores the tokens (exact: schedules.py);
  - a row's random draws depend only on its own key (from its seed) and its own iteration count, never on other
    rows;
  - a finished row (EOS, max_new_tokens, or non-finite logits: `failed`) is frozen: nothing it emits is written.
Buffers have gamma + 1 slots of slack, so no per-row write runs past the end (pitfall 6).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding.device import sampling, schedules, streaming, tree_verify, verify
from jaxspec.decoding.device.estimates import Estimates
from jaxspec.decoding.device.drafter import (DraftRequest, Drafter, History, Proposal, ProposalSettings,
                                             TreeProposal, Verdict)
from jaxspec.decoding.device.stats import DecodeStats
from jaxspec.models.contract import Decoder, StepResult, TreeNodes, write_rows

if TYPE_CHECKING:
  from jaxspec.decoding.settings import Tree


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """Static settings: changing any of these compiles a new loop."""

  target: Decoder
  drafter: Drafter  # drafter.PlainDrafter() (with gamma 0) for plain decoding.
  gamma: int  # The most draft tokens per row and iteration; 0 for plain decoding.
  max_new_tokens: int
  greedy: bool  # Temperature 0: argmax on both sides.
  filtering: bool  # Top-k or top-p active (needs a sort).
  eos_ids: tuple[int, ...]  # Every id that ends a row.
  pad_id: int  # Fills `sequences` past each row's end.
  schedule: str = "constant"  # schedules.SCHEDULES: how many tokens each row drafts ("constant" when plain).
  streaming: bool = False  # Send each iteration's tokens to the host (an ordered io_callback).
  tree: Tree | None = None  # Draft a token tree of this shape and depth gamma each iteration (schedule "constant").

  @property
  def slack(self) -> int:
    """Positions a call may write past a row's last token: gamma (a chain's block), or for a tree the most of
    its nodes (the target's verify call) and of the beam nodes a draft model or a head feeds (top_k per depth but
    the last)."""
    if self.tree is None:
      return self.gamma
    return max(self.gamma, self.tree.nodes, self.tree.top_k * (self.gamma - 1) + 1)

  @property
  def cache_len(self) -> int:
    """Loop positions per row: first token + max_new_tokens + slack for a gamma + 1 block (or a tree)."""
    return self.max_new_tokens + self.slack + 1

  @property
  def seq_len(self) -> int:
    return self.cache_len + 1

  @property
  def proposal(self) -> ProposalSettings:
    return ProposalSettings(gamma=self.gamma, cache_len=self.cache_len, greedy=self.greedy,
                            filtering=self.filtering, tree=self.tree)

  @property
  def scheduled(self) -> bool:
    """A schedule other than "constant" chooses each iteration's length (and may rest the batch)."""
    return self.schedule != "constant"

  @property
  def variable(self) -> bool:
    """Rows may draft fewer than gamma tokens (then a 1-token target call replaces one with nothing drafted)."""
    return self.scheduled or self.drafter.may_find_nothing

  @property
  def phased(self) -> bool:
    """The schedule may rest the batch and the drafter proposes whenever asked: drafting and resting iterations
    run in two inner loops (`run`), each with one static target-call width, instead of a `lax.cond` per iteration
    on the width (through which XLA copies every cache leaf each iteration)."""
    return self.scheduled and not self.drafter.may_find_nothing


@struct.dataclass
class LoopState:
  sequences: jax.Array  # [B, seq_len] int32: first token, then generated tokens; pad id at >= lengths.
  lengths: jax.Array  # [B] int32 valid tokens in `sequences`, first token included.
  done: jax.Array  # [B] bool: EOS emitted, max_new_tokens reached or failed; the row is frozen.
  failed: jax.Array  # [B] bool: the target's logits held NaN or +inf for this row; its output stops there.
  target_cache: Any
  draft_state: Any  # The drafter's own state (a draft model's cache, the lookup context; None when plain).
  schedule: schedules.ScheduleState | None  # Rows' histories (schedules other than "constant").
  keys: jax.Array  # [B] PRNG keys, one per row (from its seed); the iteration number is folded in each step.
  step: jax.Array  # [] int32 iteration counter.
  stats: DecodeStats
  rest: jax.Array | None = None  # [] bool (phased loops): the batch rests in the next iteration (schedules.limits).
  # [B] int32 per-row token budgets (<= max_new_tokens: the slot engine's per-request max_tokens), or None:
  # max_new_tokens for every row (`generate`).
  budget: jax.Array | None = None
  # Per-row EOS rules of the slot engine (None in `generate`: nothing of them is compiled). ignore_eos [B] bool: an
  # EOS does not end the row, which decodes to its budget. min_tokens [B] int32: the target's EOS logits are -inf
  # (`_mask_eos`) for the row's first min_tokens new tokens, so it never ends by EOS before them.
  ignore_eos: jax.Array | None = None
  min_tokens: jax.Array | None = None
  # The slot engine's verification budget (None in `generate`: nothing of it is compiled). limit [B] int32 in
  # [0, G]: the most tokens row b drafts this step (chains; chosen on the host from past verdicts only: exact).
  # estimates: per-row, per-position acceptance estimates (estimates.Estimates), updated by every verification.
  limit: jax.Array | None = None
  estimates: Estimates | None = None

  @property
  def history(self) -> History:
    return History(sequences=self.sequences, lengths=self.lengths, done=self.done)


def prefill(settings: LoopSettings, target_params, draft_params, input_ids: jax.Array, input_lengths: jax.Array):
  """Runs the encoders / prompt prefills once and preallocates the target's cache and the drafter's state.

  Args:
    input_ids: [B, S] int32, right-padded; input_lengths: [B] int32.
  Returns:
    (target_cache, draft_state, first_tokens [B] int32).
  """
  drafter = settings.drafter
  out = settings.target.prefill(target_params, input_ids, input_lengths, settings.cache_len,
                                layers=drafter.feature_layers, encoder=drafter.reads_encoder)
  draft_state = drafter.init(draft_params, input_ids, input_lengths, settings.cache_len, features=out.features,
                             encoder=out.encoder)
  return out.cache, draft_state, out.first


@dataclasses.dataclass(frozen=True)
class IterationKind:
  """What one compiled iteration body does (static): whether it drafts or rests, and the verify call's width
  (gamma + 1, 1, or None: picked per iteration from the proposal's counts)."""

  rests: bool
  width: int | None


def _propose(settings: LoopSettings, params: Any, knobs: sampling.SamplingKnobs, spec: schedules.SpeculationKnobs,
             state: LoopState, keys: jax.Array, kind: IterationKind) -> tuple[Proposal | TreeProposal, jax.Array | None]:
  """This iteration's proposal (a chain, or with `settings.tree` a token tree) and which rows rest ([B] bool;
  None under "constant")."""
  history, active = state.history, ~state.done
  if settings.tree is not None:  # schedule "constant": every row drafts its whole tree
    return settings.drafter.propose_tree(params, state.draft_state, history, settings.proposal, knobs, keys), None
  if kind.rests:
    return settings.drafter.idle(state.draft_state, history, settings.proposal), active
  limit, resting = None, None
  if state.limit is not None:  # the slot engine's verification budget: per-row limits from the host
    limit = jnp.where(state.done, 0, state.limit).astype(jnp.int32)
  if settings.scheduled:
    limit, resting = schedules.limits(settings.schedule, settings.gamma, spec, state.schedule, active)
  proposal = settings.drafter.propose(DraftRequest(params, state.draft_state, history, limit, settings.proposal,
                                                   knobs, spec.draft_confidence, keys,
                                                   some_row_drafts=kind.width is not None))
  return proposal, resting


def _score(settings: LoopSettings, params: Any, cache: Any, tokens: jax.Array,
           tree: TreeNodes | None = None) -> StepResult:
  """The target's one call of an iteration: tokens [B, W] (a chain's last token and drafts, or a tree's nodes
  with `tree`), with the features the drafter reads (`Drafter.feature_layers`; () collects none)."""
  with jax.named_scope("target_step"):  # Named scopes label the models' kernels in profiles.
    return settings.target.step(params, cache, tokens, tree=tree, layers=settings.drafter.feature_layers)


def _mask_eos(settings: LoopSettings, logits: jax.Array, positions: jax.Array, eos_free: jax.Array | None
              ) -> jax.Array:
  """logits [B, W, V] with every EOS id at -inf where positions [B or 1, W] (the new token each logit predicts,
  counted from the iteration's first: a chain's j, a tree node's depth) < eos_free [B] (new tokens the row still
  must emit before an EOS may end it); None: logits unchanged. Both verifiers then see a target that cannot end
  the row early, which is exactly plain decoding with the same mask (the draft's q is left as it is: a drafted
  EOS there has p = 0 and is rejected)."""
  if eos_free is None:
    return logits
  eos = jnp.zeros((logits.shape[-1],), bool).at[jnp.asarray(settings.eos_ids, jnp.int32)].set(True)  # [V]
  masked = (positions < eos_free[:, None])[:, :, None] & eos[None, None]  # [B, W, V]
  return jnp.where(masked, -jnp.inf, logits)


def _verify(settings: LoopSettings, params: Any, cache: Any, last: jax.Array, proposal: Proposal | TreeProposal,
            knobs: sampling.SamplingKnobs, keys: jax.Array, width: int | None, eos_free: jax.Array | None = None):
  """The target's call over this iteration's proposal (a chain or a tree) and its acceptance, the one verification
  entry point: (verify.Acceptance, drafts [B, G] (the accepted path's for a tree, junk past num_accepted), bad [B]
  bool, the target cache (a tree's compacted to the accepted path), features).

  last [B, 1] the rows' last tokens (a tree's root is proposal.tokens[:, 0]). features: None unless the drafter
  reads features; then [B, G + 1, F], entry j the target's feature of the j-th position the call fed on the
  accepted path (a chain: position L - 1 + j, junk past the call's width; a tree: node path[j], junk past the
  path's length), which is what `settle` reads for either. eos_free: [B] int32 or None (`_mask_eos`)."""
  if isinstance(proposal, TreeProposal):
    return _verify_tree(settings, params, cache, proposal, knobs, keys, eos_free)
  return _verify_chain(settings, params, cache, last, proposal, knobs, keys, width, eos_free)


def _verify_chain(settings: LoopSettings, params: Any, cache: Any, last: jax.Array, proposal: Proposal,
                  knobs: sampling.SamplingKnobs, keys: jax.Array, width: int | None, eos_free: jax.Array | None):
  """A chain's verification (`_verify`). width: the call's positions (gamma + 1, or 1 when nothing was drafted),
  or None: picked per iteration (1 when no row proposed anything); both branches of the lax.cond then return
  features of one shape (gamma + 1 positions, junk past the call's width)."""
  gamma, tokens, counts = settings.gamma, proposal.tokens, proposal.counts
  width_picked = width is None

  def score(cache, width: int):
    res = _score(settings, params, cache, jnp.concatenate([last, tokens[:, :width - 1]], axis=1))
    logits, features, cache = res.logits, res.features, res.cache
    if features is not None and width_picked:
      features = jnp.pad(features, ((0, 0), (0, gamma + 1 - width), (0, 0)))
    # Non-finite logits (NaN or +inf; -inf is a legitimately excluded token) fail the row: it stops here, and
    # nothing drawn from them is written.
    bad = jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=(1, 2))
    logits = _mask_eos(settings, logits, jnp.arange(width)[None], eos_free)
    drafted = counts if width > 1 else None
    if settings.greedy:
      acceptance = verify.accept_greedy(tokens[:, :width - 1], logits, drafted)
    else:
      p = sampling.warp_probs(logits, knobs, settings.filtering)
      # Nothing drafted (width 1): an empty q; deterministic proposals (one-hot): None.
      q = p[:, :0] if width == 1 else None if proposal.q is None else proposal.q[:, :width - 1]
      acceptance = verify.accept_sampled(keys, tokens[:, :width - 1], q, p, drafted)
    beta = jnp.pad(acceptance.beta, ((0, 0), (0, gamma + 1 - width)))
    return acceptance.replace(beta=beta), tokens, bad, cache, features

  if width is not None:
    return score(cache, width)
  return jax.lax.cond(jnp.any(counts > 0), lambda c: score(c, gamma + 1), lambda c: score(c, 1), cache)


def _verify_tree(settings: LoopSettings, params: Any, cache: Any, proposal: TreeProposal,
                 knobs: sampling.SamplingKnobs, keys: jax.Array, eos_free: jax.Array | None):
  """A tree's verification (`_verify`): every node in one call, the acceptance as a chain's (the accepted depths'
  beta 1 and the first rejected depth's 0), the target cache compacted to the accepted path. The cache at the
  top of an iteration holds every token but the root (the last one), so the tree's root sits at slot
  base = cache.lengths; node path[j] of the accepted path sits at position L - 1 + j, as the j-th position of a
  chain's verify call."""
  gamma, base = settings.gamma, cache.lengths
  res = _score(settings, params, cache, proposal.tokens, TreeNodes.of(proposal.depths, proposal.ancestors))
  logits, features, cache = res.logits, res.features, res.cache
  checked = logits  # non-finite values are looked for before the EOS mask (as a chain's)
  logits = _mask_eos(settings, logits, proposal.depths, eos_free)
  if settings.greedy:
    found = tree_verify.accept_tree_greedy(proposal.tokens, proposal.parents, logits, path_size=gamma + 1)
  else:
    p = sampling.warp_probs(logits, knobs, settings.filtering)
    if proposal.siblings is None:  # deterministic candidates (prompt lookup)
      found = tree_verify.accept_tree_sampled(keys, proposal.tokens, proposal.parents, p, path_size=gamma + 1)
    else:  # children drawn from the draft's q
      found = tree_verify.accept_tree_recursive(keys, proposal.tokens, proposal.parents, p, proposal.siblings,
                                                path_size=gamma + 1)
  # Non-finite logits fail a row only on its path (what plain decoding would have computed).
  on_path = jnp.take_along_axis(checked, found.path[:, :, None], axis=1)  # [B, G + 1, V]
  kept = jnp.arange(gamma + 1)[None] < found.path_len[:, None]
  bad = jnp.any((jnp.isnan(on_path) | (on_path == jnp.inf)) & kept[:, :, None], axis=(1, 2))
  n = found.num_accepted
  beta = (jnp.arange(gamma)[None] < n[:, None]).astype(jnp.float32)
  drafts = jnp.take_along_axis(proposal.tokens, found.path[:, 1:], axis=1)  # [B, G]; junk past n
  acceptance = verify.Acceptance(num_accepted=n, next_token=found.next_token, beta=beta)
  if features is not None:
    features = jnp.take_along_axis(features, found.path[:, :, None], axis=1)  # [B, G + 1, F]
  return acceptance, drafts, bad, cache.compact(base, found.path, found.path_len), features


def iteration(settings: LoopSettings, target_params: Any, draft_params: Any, knobs: sampling.SamplingKnobs,
              spec: schedules.SpeculationKnobs, stream_id: jax.Array | None, kind: IterationKind,
              state: LoopState) -> LoopState:
  """One iteration of the loop over B rows (public: `run`'s while_loop body and the slot engine's insert and
  step programs run this same function): drafting (`kind.rests`: the drafter's resting `idle` instead), one
  verify call of width `kind.width`, per-row acceptance, EOS / budget cuts, rollback and the drafter's settle.
  Returns the next LoopState (same shapes); rows already done are frozen."""
  gamma, batch = settings.gamma, state.lengths.shape[0]
  active = ~state.done
  # A row's key for this iteration folds in the row's own iteration count (stats.iterations: its active
  # iterations so far), not the batch's step: in `generate` the two are equal for every unfinished row, and in the
  # slot engine a request's draws then depend on its seed and its own progress only, never on its slot or on
  # when it joined.
  step_keys = jax.vmap(jax.random.fold_in)(state.keys, state.stats.iterations)
  draft_keys, verify_keys = sampling.fold(step_keys, 0), sampling.fold(step_keys, 1)

  proposal, resting = _propose(settings, draft_params, knobs, spec, state, draft_keys, kind)
  # New tokens the row must still emit before an EOS may end it (min_tokens; lengths - 1 are emitted so far).
  eos_free = None if state.min_tokens is None else state.min_tokens - (state.lengths - 1)
  acceptance, drafts, bad, target_cache, features = _verify(settings, target_params, state.target_cache,
                                                         state.history.last[:, None], proposal, knobs,
                                                         verify_keys, kind.width, eos_free)
  failed = state.failed | (active & bad)
  active = active & ~bad
  n = acceptance.num_accepted
  drafted = jnp.full((batch,), gamma, jnp.int32) if settings.tree or proposal.counts is None else proposal.counts

  # The emitted block: accepted drafts, then the correction/bonus token at index n; cut at EOS and budget.
  positions = jnp.arange(gamma + 1)[None]  # [1, G + 1]
  block = jnp.concatenate([drafts, jnp.zeros((batch, 1), jnp.int32)], axis=1)
  block = jnp.where(positions == n[:, None], acceptance.next_token[:, None], block)
  is_eos = jnp.isin(block, jnp.asarray(settings.eos_ids, jnp.int32)) & (positions <= n[:, None])
  if state.ignore_eos is not None:  # such a row's EOS is a token like any other: it ends at its budget
    is_eos = is_eos & ~state.ignore_eos[:, None]
  has_eos = jnp.any(is_eos, axis=1)
  emit = jnp.where(has_eos, jnp.argmax(is_eos, axis=1) + 1, n + 1)
  budget = settings.max_new_tokens if state.budget is None else state.budget
  emit = jnp.minimum(emit, budget + 1 - state.lengths)
  emit = jnp.where(active, emit, 0).astype(jnp.int32)
  lengths = state.lengths + emit
  done = state.done | failed | (active & (has_eos | (lengths > budget)))
  # Frozen rows write their own tokens back (a no-op), so nothing past a row's end changes.
  block = jnp.where(positions < emit[:, None], block, settings.pad_id)

  # Rollback: the target has now fed everything but the newest token; the drafter keeps what was accepted.
  target_cache = target_cache.rollback(lengths - 1)
  draft_state = settings.drafter.settle(Verdict(proposal, state.history, lengths, n, block, emit,
                                                params=draft_params, features=features))
  estimates = state.estimates
  if estimates is not None:
    estimates = estimates.update(active, jnp.where(active, drafted, 0), n, acceptance.beta)
  schedule = state.schedule
  if schedule is not None:
    schedule = schedules.update(schedule, gamma, jnp.where(active, drafted, 0), n, acceptance.beta, resting, active)
  if settings.streaming:
    streaming.emit(stream_id, state.step, block, emit)
  return LoopState(sequences=write_rows(state.sequences, block, state.lengths), lengths=lengths, done=done,
                   failed=failed, target_cache=target_cache, draft_state=draft_state, schedule=schedule,
                   keys=state.keys, step=state.step + 1,
                   stats=state.stats.add(active, drafted, n, acceptance.beta, resting), rest=state.rest,
                   budget=state.budget, ignore_eos=state.ignore_eos, min_tokens=state.min_tokens,
                   limit=state.limit, estimates=estimates)


def run(settings: LoopSettings, target_params, draft_params, target_cache, draft_state, first_tokens: jax.Array,
        knobs: sampling.SamplingKnobs, seeds: jax.Array, row_ids: jax.Array,
        spec: schedules.SpeculationKnobs | None = None, stream_id: jax.Array | None = None) -> LoopState:
  """Decodes until every row is done.

  Args:
    target_cache, draft_state, first_tokens: from `prefill`.
    seeds: [B] uint32, one per row; row_ids: [B] int32 folded into each row's key (the row index when one seed
      is shared by the batch, so that rows differ; 0 with per-row seeds, so that a row depends on its seed only).
    spec: the runtime speculation knobs (defaults when None; only schedules other than "constant" read them).
    stream_id: [] int32 from `streaming.register` (with settings.streaming).
  Returns:
    The final state.
  """
  # Keys are made inside the program: host-side keys cost ~1 ms per call on CPU.
  keys = jax.vmap(lambda s, r: jax.random.fold_in(jax.random.key(s), r))(seeds, row_ids)
  spec = schedules.SpeculationKnobs.create() if spec is None else spec
  batch = target_cache.lengths.shape[0]
  sequences = jnp.full((batch, settings.seq_len), settings.pad_id, jnp.int32).at[:, 0].set(first_tokens)
  no = jnp.zeros((batch,), bool)
  schedule = schedules.ScheduleState.create(batch, settings.gamma, spec) if settings.scheduled else None
  state = LoopState(
      sequences=sequences, lengths=jnp.ones((batch,), jnp.int32), done=no, failed=no, target_cache=target_cache,
      draft_state=draft_state, schedule=schedule, keys=keys, step=jnp.int32(0),
      stats=DecodeStats.create(batch, settings.gamma))

  def cond(state: LoopState):
    return jnp.any(~state.done) & (state.step <= settings.max_new_tokens)

  def step(kind: IterationKind):
    return lambda state: iteration(settings, target_params, draft_params, knobs, spec, stream_id, kind, state)

  if not settings.phased:
    return jax.lax.while_loop(cond, step(IterationKind(rests=False, width=None if settings.variable else
                                               settings.gamma + 1)), state)

  def flagged(state: LoopState) -> LoopState:
    """The state with its next decision: whether the batch rests (schedules.limits: all active rows or none).
    Stored once, so that both inner loops' conditions read the same value and one of them always advances."""
    rest = schedules.limits(settings.schedule, settings.gamma, spec, state.schedule, ~state.done)[1]
    return state.replace(rest=jnp.any(rest))

  drafting, resting = step(IterationKind(rests=False, width=settings.gamma + 1)), step(IterationKind(rests=True, width=1))

  def phases(state: LoopState):
    state = jax.lax.while_loop(lambda s: cond(s) & ~s.rest, lambda s: flagged(drafting(s)), state)
    return jax.lax.while_loop(lambda s: cond(s) & s.rest, lambda s: flagged(resting(s)), state)

  return jax.lax.while_loop(cond, phases, flagged(state))
