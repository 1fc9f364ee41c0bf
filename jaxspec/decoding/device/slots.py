"""The slot engine's device programs: every slot's state and the step, insert and wake programs over it, on the
decoding loop's own iteration (loop.iteration). Pure functions of their arguments; the host side compiles and places
them (jaxspec/decoding/slot_programs.py: their jits, static and donated arguments, the allocation's shardings) and
jaxspec/serving/engine.py (`SlotEngine`) drives them: which program runs, which slot a request fills, the host copies.

State. A fixed number of slots S, each a row of one preallocated loop state (loop.LoopState's fields: the target's
cache, the drafter's state, the token buffer, lengths, done / failed flags, the row's PRNG key) plus the row's
request settings as runtime arrays and its own iteration count (its keys fold it in): `SlotState`. `zero_state` is
every slot idle.

step_program: a `lax.while_loop` of at most `StepProgram.iterations` iterations of `loop.iteration` over R rows
(gathered from the slots when R < S, written back in place but for the cache arrays the loop returns as it got
them, such as T5's cross-attention keys and values; on a mesh each `data` group's own rows; a tier that needs
less slack than the allocation's gathers only the cache positions its loop reaches: `StepProgram.keep`), then
the new tokens of every row, finished / failed flags, drafted / accepted / iteration counts and the rows' acceptance
estimates (the verification budget's drafting tiers; per-row draft limits go in) packed in ONE [R, W + 6 + 2G] int32
array ([R, W + 6] without the estimates: a plain engine's steps and the budget's plain tier, whose iterations only
relax them, caught up by the next step that keeps them).
insert_program: the batch-1 prefill and the row's first (resting, width-1) iteration, written into one slot.
wake_program: a deferred draft model's prefill written into one slot (served_draft.py).

Shapes: S slots, R rows decoded by a step (a row bucket), W tokens per slot and step at most, G draft positions
of the acceptance estimates.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from jaxspec.decoding.device import loop, schedules
from jaxspec.decoding.device.estimates import PRIOR_ALPHA, PRIOR_COUNT, Estimates
from jaxspec.decoding.device.sampling import SamplingKnobs
from jaxspec.decoding.device.stats import DecodeStats


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotState:
  """Every slot's state on the device (S slots; the loop's fields, see loop.LoopState)."""

  sequences: jax.Array  # [S, N] int32
  lengths: jax.Array  # [S] int32
  done: jax.Array  # [S] bool: idle, finished or freed (frozen)
  failed: jax.Array  # [S] bool
  target_cache: Any
  draft_state: Any
  keys: jax.Array  # [S] PRNG keys (from each request's seed)
  iterations: jax.Array  # [S] int32 the row's iterations so far (folded into its keys)
  budget: jax.Array  # [S] int32 max_tokens
  temperature: jax.Array  # [S] float32 (0: greedy)
  top_k: jax.Array  # [S] int32
  top_p: jax.Array  # [S] float32
  ignore_eos: jax.Array  # [S] bool: an EOS does not end the row (it decodes to its budget)
  min_tokens: jax.Array  # [S] int32: new tokens before an EOS may end the row (the target's EOS logits masked)
  # The verification budget (serving/budget.py): per slot and draft position, decayed sums of beta and counts of
  # verifications (estimates.Estimates), reset to the prior at insert, updated by every iteration of a step; and
  # that prior, where unverified positions relax. A plain step (StepProgram.estimates False) leaves them out: its
  # iterations verify nothing, so they only relax every position, which the next step that keeps the estimates
  # applies at once (Estimates.relaxed) for the row's iterations since est_at.
  est_sum: jax.Array  # [S, G] float32
  est_count: jax.Array  # [S, G] float32
  est_prior: jax.Array  # [S, G] float32
  est_at: jax.Array  # [S] int32: the row's iteration count (`iterations`) its estimates are current at


@dataclasses.dataclass(frozen=True)
class StepProgram:
  """One step program's static settings."""

  settings: loop.LoopSettings
  kind: loop.IterationKind
  iterations: int
  width: int  # W: tokens per slot returned
  rows: int  # R: the rows the step decodes (a row bucket); R < S gathers them from the slots and back
  axes: tuple  # per leaf of (target cache, draft state): its batch axis, or None
  shardings: tuple | None = None  # per leaf of SlotState: where it lives on the mesh (None: one device)
  groups: int = 1  # D: the mesh's `data` size; slot s lives on group s // (S / D), and so do R / D rows decoded
  # Keep the acceptance estimates (the verification budget's): caught up (the plain steps' relaxation since the
  # row's est_at), updated, packed, stored. A plain tier's step leaves them out, as a plain engine's program.
  estimates: bool = False
  # A plain step that leaves the drafter's state out (its settings' drafter is PlainDrafter): a draft model lags
  # through plain steps with its state unchanged, so the step is called without it (`without_draft`: the caller
  # keeps it, and `shardings` are those of the other leaves), and neither gathers, writes back nor passes it.
  draft_outside: bool = False
  # Per leaf of (target cache, draft state): (its sequence axis, the positions this step decodes over) for a
  # cache the step reads and writes only a leading part of, or None: whole; () every leaf whole. A step of
  # fewer rows than slots whose draft length needs less slack than the allocation's (a plain tier beside
  # drafting ones) gathers and writes back only those positions (`Layout.kept`): what its loop can reach.
  keep: tuple = ()


def _state_of(program: StepProgram, state: SlotState, limits: jax.Array | None = None) -> loop.LoopState:
  slots = state.lengths.shape[0]
  stats = DecodeStats.create(slots, program.settings.gamma).replace(iterations=state.iterations)
  return loop.LoopState(sequences=state.sequences, lengths=state.lengths, done=state.done,
                        failed=state.failed, target_cache=state.target_cache, draft_state=state.draft_state,
                        schedule=None, keys=state.keys, step=jnp.int32(0), stats=stats, budget=state.budget,
                        ignore_eos=state.ignore_eos, min_tokens=state.min_tokens, limit=limits,
                        estimates=(Estimates(beta_sum=state.est_sum, count=state.est_count, prior=state.est_prior)
                                   .relaxed(state.iterations - state.est_at) if program.estimates else None))


def _slot_axes(program: StepProgram, state: SlotState) -> SlotState:
  """SlotState's batch axis per leaf (0 for the per-slot arrays; the layout's for the caches, None: shared); a
  state without its draft (`draft_outside`) has the target's alone (the layout lists them first)."""
  axes = program.axes
  if state.draft_state is None:
    axes = axes[:len(jax.tree_util.tree_leaves(state.target_cache))]
  return _per_leaf(state, 0, axes)


def _per_leaf(state: SlotState, default, cache_leaves: list) -> SlotState:
  """A SlotState of one value per leaf: `default` for every per-slot array, `cache_leaves` (one per leaf of
  (state.target_cache, state.draft_state), in that order) for the caches."""
  treedef = jax.tree_util.tree_structure((state.target_cache, state.draft_state))
  cache, draft = jax.tree_util.tree_unflatten(treedef, cache_leaves)
  fields = {f.name: default for f in dataclasses.fields(SlotState)}
  return SlotState(**{**fields, "target_cache": cache, "draft_state": draft})


def _grouped(program: StepProgram, x: jax.Array, axis: int, index: jax.Array):
  """(x with its batch axis S split into [D, S / D], index [R] as [D, R / D] offsets inside each group): on a mesh
  the rows of group g are the rows device g of `data` holds, and a step's rows are taken from each group's own
  (SlotEngine._rows), so the gather and the write back stay on each device (no rows cross devices)."""
  d = program.groups
  s = x.shape[axis]
  local = index.reshape(d, -1) - (jnp.arange(d, dtype=index.dtype) * (s // d))[:, None]
  return x.reshape(x.shape[:axis] + (d, s // d) + x.shape[axis + 1:]), local


def _kept(program: StepProgram, state: SlotState) -> SlotState:
  """`program.keep` per leaf of SlotState: (sequence axis, positions) for the cache leaves a step decodes a leading
  part of, None for every other leaf (a state without its draft: the target's leaves alone, as `_slot_axes`)."""
  leaves = jax.tree_util.tree_leaves((state.target_cache, state.draft_state))
  return _per_leaf(state, None, list(program.keep[:len(leaves)]) or [None] * len(leaves))


def _region(x: jax.Array, axis: int, rows, keep: tuple[int, int] | None) -> tuple:
  """The index of rows `rows` (on `axis`) of x, and, with keep = (sequence axis, n), only its first n positions."""
  index = [slice(None)] * x.ndim
  index[axis] = rows
  if keep is not None:
    index[keep[0]] = slice(0, keep[1])
  return tuple(index)


def _take_rows(program: StepProgram, state: SlotState, index: jax.Array) -> SlotState:
  """The R rows `index` ([R] int32, distinct, sorted; R / D of each group on a mesh) of every slot array, each
  cache leaf cut to the positions the step decodes (`program.keep`)."""
  def take(x, axis, keep):
    if axis is None:
      return x
    if keep is not None:
      x = jax.lax.slice_in_dim(x, 0, keep[1], axis=keep[0])
    if program.groups == 1:
      return jnp.take(x, index, axis=axis)
    groups, local = _grouped(program, x, axis, index)
    rows = jax.vmap(lambda g, i: jnp.take(g, i, axis=axis), in_axes=(axis, 0), out_axes=axis)(groups, local)
    return rows.reshape(x.shape[:axis] + (index.shape[0],) + x.shape[axis + 1:])
  return jax.tree_util.tree_map(take, state, _slot_axes(program, state), _kept(program, state),
                                is_leaf=lambda a: a is None)


def _put_rows(program: StepProgram, state: SlotState, rows: SlotState, index: jax.Array,
              unchanged: SlotState) -> SlotState:
  """`state` with rows `index` replaced by `rows` (in place: the state is donated), but for the leaves the step
  never changed (`unchanged`, per leaf of SlotState: True where the rows are the ones taken, e.g. T5's
  cross-attention keys and values), which are left as they are instead of written back unchanged; a cache leaf
  the step decoded a leading part of (`program.keep`) is written back there alone."""
  def put(x, r, axis, same, keep):
    if same:
      return x
    if axis is None:
      return r
    if program.groups == 1:
      return x.at[_region(x, axis, index, keep)].set(r, indices_are_sorted=True, unique_indices=True)
    groups, local = _grouped(program, x, axis, index)
    r = r.reshape(r.shape[:axis] + (program.groups, -1) + r.shape[axis + 1:])
    new = jax.vmap(lambda g, v, i: g.at[_region(g, axis, i, keep)].set(v, indices_are_sorted=True,
                                                                       unique_indices=True),
                   in_axes=(axis, axis, 0), out_axes=axis)(groups, r, local)
    return new.reshape(x.shape)
  return jax.tree_util.tree_map(put, state, rows, _slot_axes(program, state), unchanged, _kept(program, state),
                                is_leaf=lambda a: a is None)


def step_program(program: StepProgram, target_params, draft_params, state: SlotState, stop: jax.Array,
                 index: jax.Array, limits: jax.Array | None = None):
  """(new state, packed [R, W + 6 + 2G] int32 for the rows `index` ([R] int32: distinct slots, sorted; every slot
  when R == S): tokens [R, W] (this step's new tokens, pad after), counts, finished, failed, drafted, accepted,
  iterations (verifications), then the rows' acceptance estimates (est_sum, est_count [R, G] float32, bitcast;
  only with `program.estimates`: [R, W + 6] without)).
  limits: [R] int32 per-row draft limits (the verification budget's), or None: the program's gamma for every row."""
  if program.draft_outside and state.draft_state is not None:
    raise ValueError("a step program that leaves the draft out (draft_outside) takes the state without it "
                     "(`without_draft`)")
  state = dataclasses.replace(state, done=state.done | stop)  # a freed slot is frozen even when not decoded
  shardings = program.shardings
  if program.rows == state.lengths.shape[0]:
    new, packed, _ = _decode_rows(program, target_params, draft_params, state, limits)
  else:  # the R rows split over the mesh as the slots are (R a multiple of `data`), decoded, written back in place
    rows = _placed(_take_rows(program, state, index), shardings)
    rows, packed, unchanged = _decode_rows(program, target_params, draft_params, rows, limits)
    new = _put_rows(program, state, rows, index, unchanged)
  return _placed(new, shardings), _everywhere(packed, shardings)


def without_draft(state: SlotState, shardings: tuple | None = None) -> tuple[SlotState, tuple | None]:
  """`state` without its drafter's state (draft_state None), and `shardings` (per leaf of `state`, or None)
  without the draft's leaves: what a step program that leaves a lagging draft out (`draft_outside`) takes. The
  draft's state stays with the caller: passed in and back out unread, its buffers (donated with the rest) cost a
  plain step at 4 rows 1-1.5 % on the embedded pair (docs/serving.md, twenty-second session)."""
  if shardings is not None:
    tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), shardings)
    shardings = tuple(jax.tree_util.tree_leaves(dataclasses.replace(tree, draft_state=None)))
  return dataclasses.replace(state, draft_state=None), shardings


def _decode_rows(program: StepProgram, target_params, draft_params, state: SlotState,
                 limits: jax.Array | None = None):
  """The bounded while_loop over the rows of `state` (all of them): (their new state, packed, unchanged: per leaf
  of SlotState, whether the loop's iteration returns that leaf of the caches as it got it (found while tracing:
  the very same value), so the rows' new state holds it as `state` did)."""
  settings = program.settings
  knobs = SamplingKnobs(temperature=state.temperature, top_k=state.top_k, top_p=state.top_p)
  spec = schedules.SpeculationKnobs.create()
  start = _state_of(program, state, limits)
  caches = lambda s: jax.tree_util.tree_leaves((s.target_cache, s.draft_state))
  forwarded = []  # per leaf of (target cache, draft state), set while the body is traced

  def body(s):
    out = loop.iteration(settings, target_params, draft_params, knobs, spec, None,
                         program.kind, s)
    forwarded[:] = [a is b for a, b in zip(caches(s), caches(out), strict=True)]
    return out

  end = jax.lax.while_loop(lambda s: jnp.any(~s.done) & (s.step < program.iterations), body, start)
  positions = jnp.clip(start.lengths[:, None] + jnp.arange(program.width)[None], 0, end.sequences.shape[1] - 1)
  counts = end.lengths - start.lengths
  tokens = jnp.take_along_axis(end.sequences, positions, axis=1)
  tokens = jnp.where(jnp.arange(program.width)[None] < counts[:, None], tokens, settings.pad_id)
  finished = end.done & ~start.done
  # The verification budget's estimates ride in the same copy (float32 bitcast to int32); without it none.
  estimates = [] if end.estimates is None else [jax.lax.bitcast_convert_type(x, jnp.int32)
                                                for x in (end.estimates.beta_sum, end.estimates.count)]
  packed = jnp.concatenate([tokens, jnp.stack([counts, finished.astype(jnp.int32), end.failed.astype(jnp.int32),
                                               end.stats.drafted, end.stats.accepted,
                                               end.stats.iterations - start.stats.iterations], axis=1)] + estimates,
                           axis=1)
  new = dataclasses.replace(state, sequences=end.sequences, lengths=end.lengths, done=end.done, failed=end.failed,
                            target_cache=end.target_cache, draft_state=end.draft_state,
                            iterations=end.stats.iterations)
  if end.estimates is not None:
    new = dataclasses.replace(new, est_sum=end.estimates.beta_sum, est_count=end.estimates.count,
                              est_at=end.stats.iterations)
  # A loop that never called its body (under jax.disable_jit, no iteration ran): everything is written back.
  return new, packed, _per_leaf(state, False, forwarded or [False] * len(caches(state)))


def _placed(state: SlotState, shardings: tuple | None) -> SlotState:
  """`state` constrained to `shardings` (per leaf; None: one device, as it is): a program's outputs stay where the
  slots were allocated (rows over `data`, heads over `model`), never resharded to replicated by the compiler."""
  if shardings is None:
    return state
  leaves, treedef = jax.tree_util.tree_flatten(state)
  return jax.tree_util.tree_unflatten(treedef, [jax.lax.with_sharding_constraint(x, s)
                                                for x, s in zip(leaves, shardings)])


def _everywhere(packed: jax.Array, shardings: tuple | None) -> jax.Array:
  """A program's small packed output (the step's [R, W + 5], the insert's [4]) replicated on the mesh: every process
  reads it whole (one small copy)."""
  if shardings is None:
    return packed
  return jax.lax.with_sharding_constraint(packed, NamedSharding(shardings[0].mesh, PartitionSpec()))


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where each prefilled leaf goes: per leaf of (target cache, draft state), its batch axis (None: no batch
  axis; declared by `Decoder.cache_axes` and `Drafter.state_axes`) and its shape for one row at the largest
  bucket (what shorter buckets are padded to); per leaf of SlotState its sharding on the mesh (None: one
  device)."""

  axes: tuple
  shapes: tuple
  shardings: tuple | None = None
  seq_axes: tuple = ()  # per leaf: the target cache's declared "cache_seq" axis, None elsewhere (the drafter's)

  def kept(self, trim: int) -> tuple:
    """StepProgram.keep for a step whose loop reaches `trim` fewer positions than the allocation's: every target
    cache leaf with a sequence axis cut by `trim` at its end, every other leaf whole (() when trim is 0)."""
    if trim <= 0:
      return ()
    return tuple(None if s is None else (s, shape[s] - trim) for s, shape in zip(self.seq_axes, self.shapes))


def _write_row(row, state, axes, shapes, slot: jax.Array):
  """`state` (a pytree of every slot's arrays) with the batch-1 pytree `row` written at `slot` ([] int32): per
  leaf its batch axis (None: shared, kept as it is) and one row's shape at the largest bucket (`row`'s leaves,
  shaped by the prompt's bucket, are zero-padded to it)."""
  leaves, treedef = jax.tree_util.tree_flatten(row)
  new = []
  for leaf, old, axis, shape in zip(leaves, jax.tree_util.tree_leaves(state), axes, shapes):
    if axis is None:
      new.append(old)
      continue
    leaf = jnp.pad(leaf, [(0, t - s) for s, t in zip(leaf.shape, shape)])
    new.append(jax.lax.dynamic_update_slice_in_dim(old, leaf.astype(old.dtype), slot, axis=axis))
  return jax.tree_util.tree_unflatten(treedef, new)


@dataclasses.dataclass(frozen=True)
class InsertProgram:
  """The insert program's static settings: the prefill's (`alloc`: the largest slack; a draft model's init
  deferred) and the first token's resting iteration (`settings`, `kind`: a plain entry's, in one sampling mode)."""

  alloc: loop.LoopSettings
  settings: loop.LoopSettings
  kind: loop.IterationKind


def insert_program(first: InsertProgram, layout: Layout, target_params, draft_params, state: SlotState,
                    slot: jax.Array, ids: jax.Array, length: jax.Array, seed: jax.Array, temperature: jax.Array,
                    top_k: jax.Array, top_p: jax.Array, max_tokens: jax.Array, ignore_eos: jax.Array,
                    min_tokens: jax.Array, prior: jax.Array):
  """Prefills one request (ids [1, bucket], length [1]), runs its first loop iteration alone (width 1, the
  drafter resting: the first new token, as a plain step's first iteration draws it) and writes the row into
  `slot` ([] int32) of `state`, its acceptance estimates at `prior` ([G] float32 a(j): the served requests'
  verdicts pooled, serving/budget.AcceptancePrior): (new state, [4] int32: the token, tokens emitted (0: failed),
  done, failed)."""
  cache, draft_state, last = loop.prefill(first.alloc, target_params, draft_params, ids, length)
  row = loop.LoopState(
      sequences=jnp.full((1, state.sequences.shape[1]), first.alloc.pad_id, jnp.int32).at[:, 0].set(last),
      lengths=jnp.ones((1,), jnp.int32), done=jnp.zeros((1,), bool), failed=jnp.zeros((1,), bool),
      target_cache=cache, draft_state=draft_state, schedule=None,
      keys=jax.random.fold_in(jax.random.key(seed), 0)[None], step=jnp.int32(0),
      stats=DecodeStats.create(1, first.settings.gamma), budget=max_tokens[None], ignore_eos=ignore_eos[None],
      min_tokens=min_tokens[None])
  knobs = SamplingKnobs(temperature=temperature[None], top_k=top_k[None], top_p=top_p[None])
  spec = schedules.SpeculationKnobs.create()
  end = loop.iteration(first.settings, target_params, draft_params, knobs, spec, None, first.kind, row)
  cache, draft_state = _write_row((end.target_cache, end.draft_state), (state.target_cache, state.draft_state),
                                  layout.axes, layout.shapes, slot)
  prior = Estimates.prior_at(1, state.est_sum.shape[1], prior[None])

  def put(array, value):
    return array.at[slot].set(value[0])

  new = SlotState(sequences=jax.lax.dynamic_update_slice_in_dim(state.sequences, end.sequences, slot, axis=0),
                  lengths=put(state.lengths, end.lengths), done=put(state.done, end.done),
                  failed=put(state.failed, end.failed), target_cache=cache, draft_state=draft_state,
                  keys=put(state.keys, row.keys), iterations=put(state.iterations, end.stats.iterations),
                  budget=put(state.budget, max_tokens[None]), temperature=put(state.temperature, temperature[None]),
                  top_k=put(state.top_k, top_k[None]), top_p=put(state.top_p, top_p[None]),
                  ignore_eos=put(state.ignore_eos, ignore_eos[None]), min_tokens=put(state.min_tokens, min_tokens[None]),
                  # the verification budget's estimates start at, and relax toward, the served requests' acceptance
                  est_sum=put(state.est_sum, prior.beta_sum), est_count=put(state.est_count, prior.count),
                  est_prior=put(state.est_prior, prior.prior), est_at=put(state.est_at, end.stats.iterations))
  out = jnp.stack([end.sequences[0, 1], end.lengths[0] - 1, end.done[0].astype(jnp.int32),
                   end.failed[0].astype(jnp.int32)])
  return _placed(new, layout.shardings), _everywhere(out, layout.shardings)


def wake_program(alloc: loop.LoopSettings, layout: Layout, draft_params, state: SlotState, slot: jax.Array,
                  ids: jax.Array, length: jax.Array) -> SlotState:
  """Prefills the draft model of row `slot` ([] int32) on its prompt (ids [1, bucket], length [1]): a row inserted
  without it (served_draft.py) drafts from now on; its draft lags by the tokens generated since, which the
  catch-up feeds. The target's cache and every other array are left as they are."""
  draft = alloc.drafter.init(draft_params, ids, length, alloc.cache_len)
  n = len(jax.tree_util.tree_leaves(state.target_cache))  # the layout lists the target's leaves first
  return _placed(dataclasses.replace(state, draft_state=_write_row(draft, state.draft_state, layout.axes[n:],
                                                                   layout.shapes[n:], slot)), layout.shardings)


def zero_state(n: int, seq_len: int, pad: int, positions: int, cache_tree, full) -> SlotState:
  """Every one of `n` slots idle: `full` (per leaf of (target cache, draft state), its ShapeDtypeStruct at n rows;
  `cache_tree` their treedef) zeros, every other array its idle value (the acceptance estimates, [n, positions],
  their prior). One program (slot_programs.allocate jits it
  with the allocation's shardings): every buffer its own (donation needs distinct buffers), allocated in place."""
  cache, draft = jax.tree_util.tree_unflatten(cache_tree, [jnp.zeros(s.shape, s.dtype) for s in full])
  zeros_i = jnp.zeros((n,), jnp.int32)
  return SlotState(sequences=jnp.full((n, seq_len), pad, jnp.int32), lengths=jnp.ones((n,), jnp.int32),
                   done=jnp.ones((n,), bool), failed=jnp.zeros((n,), bool), target_cache=cache,
                   draft_state=draft, keys=jax.vmap(jax.random.key)(jnp.zeros((n,), jnp.uint32)),
                   iterations=zeros_i, budget=jnp.ones((n,), jnp.int32),
                   temperature=jnp.zeros((n,), jnp.float32), top_k=jnp.zeros((n,), jnp.int32),
                   top_p=jnp.ones((n,), jnp.float32), ignore_eos=jnp.zeros((n,), bool),
                   min_tokens=jnp.zeros((n,), jnp.int32),
                   est_sum=jnp.full((n, positions), PRIOR_COUNT * PRIOR_ALPHA, jnp.float32),
                   est_count=jnp.full((n, positions), PRIOR_COUNT, jnp.float32),
                   est_prior=jnp.full((n, positions), PRIOR_ALPHA, jnp.float32), est_at=jnp.zeros((n,), jnp.int32))
