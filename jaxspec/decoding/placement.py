"""Decoding on a mesh: where `generate`'s inputs, caches and outputs live when the target is sharded.

This module owns compilation: `PREFILL` and `RUN` are the one jit of each entry point (loop.prefill, loop.run)
for a single device, and `ShardedProgram` jits the same functions with explicit shardings for a mesh. `plan`
computes where a call lives (no transfer: the memory check reads it), then `prepare` returns the call's programs
and arguments. For a target on one device they are `PREFILL` / `RUN` and the inputs as given. For a target
placed on a mesh (`jaxspec.shard`, `jaxspec.load(..., mesh=...)`):
  - the batch is padded to a multiple of the `data` axis with copies of the last row, each with its own RNG key
    (a seed row id past the real rows); `fetch` drops the padding rows from outputs and stats;
  - ids, lengths, seeds and every other per-row array are split over `data`;
  - caches are placed by their family's `cache_axes` and the rules the model's parameters were placed by (heads
    over `model` where the weights' heads are, batch over `data`): explicit `out_shardings` of the prefill and the
    loop, and the loop's `in_shardings`, so the compiler neither replicates them nor gathers weights (the caches
    are still donated to the loop);
  - the drafter's params (`drafter.DraftSource`) are placed one way for every kind (`draft_params_on`): arrays
    already on the mesh stay (a feature head reads the target's embedding as the target placed it), a draft
    model's other weights are placed by its axes under `DRAFT_RULES` (replicated over `model`, docs/scaling.md),
    a head's replicated (one decoder layer, small beside the target); once per mesh, the placed copy kept beside
    the user's draft or head for later calls (not on it: `_kept_copy`).
Convention read here: in every program output, the target's cache comes before the draft's (flatten order).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxspec.decoding.device import loop
from jaxspec.errors import SettingsError
from jaxspec.sharding import DRAFT_RULES, Rules, mesh_of, place, rules_of, tree_shardings

PREFILL = jax.jit(loop.prefill, static_argnums=0)
RUN = jax.jit(loop.run, static_argnums=0, donate_argnums=(3, 4))  # the caches are donated


def compiled_counts() -> tuple[int, int]:
  """(prefill, loop) programs compiled so far for single-device calls: a test of "no recompilation" reads it."""
  return PREFILL._cache_size(), RUN._cache_size()  # pylint: disable=protected-access


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where one target/draft pair lives: its mesh and the rules of each model's caches (hashable)."""

  mesh: Mesh
  batch: int  # Rows after padding (a multiple of the data axis).
  caches: tuple  # ((family, config, rules) of the target, then the draft's when there is one).

  @property
  def target_rules(self) -> Rules:
    return self.caches[0][2]

  @property
  def draft_rules(self) -> Rules:
    return self.caches[1][2] if len(self.caches) > 1 else DRAFT_RULES

  @property
  def shape(self) -> tuple[int, int]:
    """(data, model) sizes of the mesh."""
    sizes = dict(self.mesh.shape)
    return sizes.get("data", 1), sizes.get("model", 1)

  @property
  def data(self) -> int:
    return dict(self.mesh.shape).get("data", 1)

  def row_sharding(self, shape: tuple) -> NamedSharding:
    """Per-row arrays ([B, ...] with B the padded batch) over `data`; anything else replicated."""
    rows = len(shape) > 0 and shape[0] == self.batch and self.data > 1
    return NamedSharding(self.mesh, PartitionSpec("data") if rows else PartitionSpec())


def _is_cache(x) -> bool:
  """A family's cache (`DecoderCache`), also when its leaves are abstract (no property is evaluated)."""
  return callable(getattr(type(x), "rollback", None)) and hasattr(x, "lengths")


def _freeze(tree) -> tuple:
  """A hashable form of a pytree of shardings (dicts are not hashable)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(leaves)


def _signature(args) -> tuple:
  leaves, treedef = jax.tree.flatten(args)
  return treedef, tuple((tuple(np.shape(x)), np.result_type(x) if not hasattr(x, "dtype") else x.dtype,
                         getattr(x, "sharding", None)) for x in leaves)


def _abstract(signature) -> Any:
  treedef, leaves = signature
  return jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(s, d, sharding=sh if isinstance(sh, NamedSharding)
                                                           else None) for s, d, sh in leaves])


@functools.lru_cache(maxsize=64)
def _out_shardings(fun: Callable, settings, placement: Placement, signature) -> Any:
  """Shardings of fun(settings, *args)'s outputs: caches by their axes and rules, per-row arrays over `data`."""
  out = jax.eval_shape(functools.partial(fun, settings), *_abstract(signature))
  caches = iter(placement.caches)

  def one(x):
    known = next(caches, None) if _is_cache(x) else None
    if known is None:  # Anything else (an n-gram drafter's context too) is per-row or replicated.
      return jax.tree.map(lambda leaf: placement.row_sharding(leaf.shape), x)
    family, config, rules = known
    shardings, _ = tree_shardings(family.cache_axes(config), x, placement.mesh, rules)
    return shardings

  return _freeze(jax.tree.map(one, out, is_leaf=_is_cache))


@functools.lru_cache(maxsize=64)
def _jitted(fun: Callable, donate_argnums: tuple, in_shardings: tuple, out_shardings: tuple):
  """jax.jit of fun with static settings and the (frozen) shardings: one jit object, so one compilation each."""
  return jax.jit(fun, static_argnums=0, donate_argnums=donate_argnums,
                 in_shardings=jax.tree.unflatten(*in_shardings), out_shardings=jax.tree.unflatten(*out_shardings))


class ShardedProgram:
  """`fun(settings, *args)` jitted with explicit input and output shardings for a placement (one compiled
  program per settings, shapes and shardings). Arguments already on the mesh keep their sharding; host arrays
  are placed as per-row arrays."""

  def __init__(self, fun: Callable, placement: Placement, donate_argnums: tuple = ()):
    self.fun, self.placement, self.donate_argnums = fun, placement, tuple(donate_argnums)

  def _sharding(self, x) -> NamedSharding:
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh == self.placement.mesh:
      return sharding
    return self.placement.row_sharding(tuple(np.shape(x)))

  def _program(self, settings, args):
    in_shardings = jax.tree.map(self._sharding, args)
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype") else
                                                              np.result_type(x), sharding=s), args, in_shardings)
    out = _out_shardings(self.fun, settings, self.placement, _signature(abstract))
    return _jitted(self.fun, self.donate_argnums, _freeze(in_shardings), out), in_shardings

  def __call__(self, settings, *args):
    program, in_shardings = self._program(settings, args)
    if jax.process_count() > 1:  # Host arrays must become global arrays; one process jits them in directly.
      args = jax.tree.map(lambda x, s: x if isinstance(x, jax.Array) else place(x, s), args, in_shardings)
    return program(settings, *args)

  def lower(self, settings, *args):
    return self._program(settings, args)[0].lower(settings, *args)

  def eval_shape(self, settings, *args):
    program, _ = self._program(settings, args)
    return program.eval_shape(settings, *args)


@dataclasses.dataclass
class Call:
  """The programs and arguments of one `generate` call; `fetch` brings outputs to the host, padding rows dropped."""

  prefill: Callable
  run: Callable
  target_params: Any
  draft_params: Any
  ids: Any  # [B', S] B' = batch padded to a multiple of `data`.
  lengths: Any  # [B']
  seeds: Any  # [B']
  row_ids: Any  # [B']
  real: int  # B: rows the caller asked for.
  placement: Placement | None = None

  def fetch(self, tree):
    """numpy copies of `tree`'s arrays on every process, per-row arrays cut to the real rows."""
    if self.placement is None:
      return jax.device_get(tree)
    if jax.process_count() > 1:
      tree = jax.tree.map(lambda x: multihost_utils.process_allgather(x, tiled=True), tree)
    tree = jax.device_get(tree)
    return jax.tree.map(lambda x: x[:self.real] if np.ndim(x) and x.shape[0] == self.placement.batch else x, tree)


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
  return np.concatenate([x, np.repeat(x[-1:], rows, axis=0)]) if rows else x


def plan(target, draft, batch: int) -> Placement | None:
  """Where a call of `batch` rows lives: None on one device, else its mesh, padded batch and cache rules.
  Moves nothing. draft: the draft model or None. Raises SettingsError when only the draft is on a mesh."""
  mesh = mesh_of(target.params)
  if mesh is None:
    if draft is not None and mesh_of(draft.params) is not None:
      raise SettingsError("the draft is placed on a mesh but the target is not: place the target with "
                          "jaxspec.shard(target, mesh) (or load it with mesh=...).")
    return None
  data = dict(mesh.shape).get("data", 1)
  caches = [(target.family, target.config, rules_of(target))]
  if draft is not None:
    caches.append((draft.family, draft.config, rules_of(draft) if mesh_of(draft.params) == mesh else DRAFT_RULES))
  return Placement(mesh=mesh, batch=batch + (-batch % data), caches=tuple(caches))


def draft_params_on(source, mesh: Mesh | None) -> Any:
  """A `drafter.DraftSource`'s params where the loop reads them, one way for a draft model, a feature head and
  prompt lookup: as they are without a mesh (or without params); on `mesh`, every array already there as it is and
  every other one placed, by the draft model's own axes under DRAFT_RULES (replicated over `model`) when the
  source is a draft model, else replicated. Placed once per mesh and kept beside `source.owner` (keyed by the
  arrays' identity), never stored on it."""
  if mesh is None or source.params is None:
    return source.params
  leaves, treedef = jax.tree.flatten(source.params)
  key = (mesh, tuple(id(x) for x in leaves))

  def placed():
    if source.model is None:
      shardings = [NamedSharding(mesh, PartitionSpec())] * len(leaves)
    else:
      model = source.model
      tree, _ = tree_shardings(model.family.param_axes(model.config), source.params, mesh, DRAFT_RULES)
      shardings = jax.tree.leaves(tree)
    return (leaves, [x if mesh_of(x) == mesh else place(x, s) for x, s in zip(leaves, shardings)])  # keeps ids

  return jax.tree.unflatten(treedef, _kept_copy(source.owner, key, placed)[1])


# Placed copies of a draft's weights, one per owner (a draft model or a feature head), kept beside it rather than
# on it: {id(owner): (weak reference to the owner, key, copy)}; an entry goes when its owner is collected.
_COPIES: dict[int, tuple[Any, tuple, Any]] = {}


def _kept_copy(owner: Any, key: tuple, make: Callable[[], Any]) -> Any:
  """The copy `make()` placed for `owner` under `key`, made once (one copy per owner: a draft decodes beside one
  target mesh). Nothing is stored on the owner."""
  i = id(owner)
  entry = _COPIES.get(i)
  if entry is None or entry[0]() is not owner or entry[1] != key:
    ref = weakref.ref(owner, lambda _, i=i: _COPIES.pop(i, None))
    _COPIES[i] = entry = (ref, key, make())
  return entry[2]


def prepare(where: Placement | None, target, source, ids: np.ndarray, lengths: np.ndarray, seeds: np.ndarray,
            row_ids: np.ndarray) -> Call:
  """The programs and arguments for decoding `ids` [B, S] with `target` and the `drafter.DraftSource` `source`
  where `plan` placed them (the drafter's params by `draft_params_on`)."""
  draft_params = draft_params_on(source, None if where is None else where.mesh)
  if where is None:
    return Call(PREFILL, RUN, target.params, draft_params, ids, lengths, seeds, row_ids, real=ids.shape[0])
  real = ids.shape[0]
  pad = where.batch - real
  ids, lengths, seeds = (_pad_rows(x, pad) for x in (ids, lengths, seeds))
  # Every padding row gets its own key: a row id past the real rows (its outputs are dropped anyway).
  row_ids = np.concatenate([row_ids, np.arange(real, real + pad, dtype=row_ids.dtype)])
  return Call(ShardedProgram(loop.prefill, where), ShardedProgram(loop.run, where, donate_argnums=(3, 4)),
              target.params, draft_params, ids, lengths, seeds, row_ids, real=real, placement=where)
