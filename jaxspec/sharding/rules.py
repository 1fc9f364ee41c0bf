"""Logical-axis rules: how each named dimension of a parameter or cache maps onto the ("data", "model") mesh.

Every family names the dimensions of its parameters and caches (`Family.param_axes`, `Family.cache_axes`: "batch",
"heads", "kv_heads", "kv", "mlp", "vocab", "embed", "cache_seq", "layers", ...). A short table maps each name to a
mesh axis, t5x / maxtext style: batch over `data`; heads, kv heads, mlp and vocab over `model`; embed, head width
(`kv`), positions and layers replicated. Names missing from the table are replicated.

    rules = resolve_rules({"vocab": None})               # defaults, vocab replicated
    spec, note = spec_for(("embed", "heads", "kv"), (1024, 128, 128), mesh, rules)   # P(None, 'model', None)

A dimension that its mesh axis does not divide (3 heads on model=2) is replicated along that axis, never an
error: `spec_for` returns a note saying so, and `jaxspec.memory_plan` lists the notes.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Union

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

MeshAxes = Union[str, tuple, None]  # One mesh axis name, several (a dimension split over both), or None.
Rules = tuple  # ((logical name, MeshAxes), ...): hashable, so it can key caches of compiled programs.

DEFAULT_RULES: Rules = (
    ("batch", "data"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("mlp", "model"),
    ("vocab", "model"),
    ("embed", None),
    ("kv", None),  # Head width.
    ("cache_seq", None),
    ("encoder_seq", None),
    ("layers", None),
    ("relpos_buckets", None),
)

# For a small draft: only the batch is split; its weights are replicated over `model` (docs/scaling.md says why).
DRAFT_RULES: Rules = tuple((name, "data" if name == "batch" else None) for name, _ in DEFAULT_RULES)


def is_axes(x: Any) -> bool:
  """True for a leaf of an axes pytree: a tuple of logical names (the empty tuple for a scalar)."""
  return isinstance(x, tuple) and all(isinstance(a, str) for a in x)


def resolve_rules(rules: Mapping[str, MeshAxes] | Iterable[tuple[str, MeshAxes]] | None = None,
                  base: Rules = DEFAULT_RULES) -> Rules:
  """`base` with `rules` overriding the names it gives (a dict or (name, mesh axes) pairs); None keeps `base`."""
  if rules is None:
    return tuple(base)
  pairs = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
  table = dict(base)
  for pair in pairs:
    if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
      raise ValueError(f"rules: expected (logical name, mesh axis) pairs or a dict, got {pair!r}.")
    name, axes = pair
    for axis in (axes if isinstance(axes, tuple) else (axes,)):
      if axis is not None and not isinstance(axis, str):
        raise ValueError(f"rules: {name!r} maps to {axes!r}: expected a mesh axis name, a tuple of them, or None.")
    table[name] = axes
  return tuple(table.items())


def _mesh_sizes(mesh: Mesh | AbstractMesh) -> dict[str, int]:
  return dict(mesh.shape)


def spec_for(axes: tuple, shape: tuple, mesh: Mesh | AbstractMesh, rules: Rules) -> tuple[PartitionSpec, list[str]]:
  """The PartitionSpec of an array with logical `axes` and `shape` on `mesh` (a Mesh, or an AbstractMesh for
  planning without the devices), and notes on what was replicated.

  A dimension is split over its rule's mesh axes when they exist in the mesh, have more than one device, are not
  already used by an earlier dimension of the same array, and divide its size; otherwise it is replicated, and
  a note names the dimension when only divisibility stopped it.
  """
  if len(axes) != len(shape):
    raise ValueError(f"logical axes {axes} do not match the array's shape {shape}.")
  table, sizes, used = dict(rules), _mesh_sizes(mesh), set()
  spec, notes = [], []
  for name, size in zip(axes, shape):
    wanted = table.get(name)
    wanted = tuple(a for a in (wanted if isinstance(wanted, tuple) else (wanted,))
                   if a is not None and sizes.get(a, 1) > 1 and a not in used)
    split = math.prod(sizes[a] for a in wanted)
    if wanted and size % split:
      notes.append(f"{name}={size} is not divisible by {'x'.join(wanted)}={split}: replicated")
      wanted = ()
    used.update(wanted)
    spec.append(None if not wanted else wanted[0] if len(wanted) == 1 else wanted)
  while spec and spec[-1] is None:
    spec.pop()
  return PartitionSpec(*spec), notes


def local_shape(shape: tuple, spec: PartitionSpec, mesh: Mesh | AbstractMesh) -> tuple[int, ...]:
  """The per-device shape of an array of `shape` placed with `spec` on `mesh`."""
  sizes, out = _mesh_sizes(mesh), list(shape)
  for d, entry in enumerate(spec):
    for axis in (entry if isinstance(entry, tuple) else (entry,)):
      if axis is not None:
        out[d] //= sizes[axis]
  return tuple(out)


def tree_shardings(axes_tree: Any, shapes_tree: Any, mesh: Mesh, rules: Rules) -> tuple[Any, list[str]]:
  """(pytree of NamedSharding, notes) for a pytree of logical axes and a matching pytree of shapes (tuples, arrays
  or ShapeDtypeStructs). Notes are prefixed with each array's path."""
  notes: list[str] = []

  def one(path, axes, shaped):
    shape = tuple(shaped) if isinstance(shaped, tuple) else tuple(np.shape(shaped))
    spec, why = spec_for(axes, shape, mesh, rules)
    notes.extend(f"{jax.tree_util.keystr(path)}: {w}" for w in why)
    return NamedSharding(mesh, spec)

  shardings = jax.tree_util.tree_map_with_path(one, axes_tree, shapes_tree, is_leaf=is_axes)
  return shardings, notes


def infer_rules(axes_tree: Any, placed_tree: Any, base: Rules = DEFAULT_RULES) -> Rules:
  """The rules a placed pytree follows: each logical name gets the mesh axes its arrays are split over (first
  seen wins); names no array shows keep `base`'s entry. Caches follow their parameters' placement this way."""
  seen: dict[str, MeshAxes] = {}

  def visit(axes, x):
    spec = tuple(getattr(getattr(x, "sharding", None), "spec", ()))
    for d, name in enumerate(axes):
      entry = spec[d] if d < len(spec) else None
      if name not in seen or (seen[name] is None and entry is not None):
        seen[name] = entry

  jax.tree.map(visit, axes_tree, placed_tree, is_leaf=is_axes)
  return resolve_rules(seen, base)
