"""Placing a model's parameters on a mesh, and reading back where a model lives.

    model = jaxspec.shard(model, mesh)                        # every parameter with its NamedSharding
    draft = jaxspec.shard(draft, mesh, rules=DRAFT_RULES)     # a small draft: replicated over `model`
    mesh_of(model.params), rules_of(model)                    # what `jaxspec.generate` reads

A model's placement lives in its arrays' shardings, nothing else: `rules_of` reads the rules back from them (so
a model that `dataclasses.replace` copied, or whose parameters were placed by hand, keeps working).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxspec.sharding.rules import DEFAULT_RULES, Rules, infer_rules, resolve_rules, tree_shardings


def place(x: Any, sharding: NamedSharding) -> jax.Array:
  """`x` (a numpy or jax array, the same full value on every process, or a global array) with `sharding`.

  On one process this is `jax.device_put`; on several, each process builds only the shards of its own devices
  from its copy (`jax.make_array_from_callback`), and a global array is resharded (`jax.device_put`).
  """
  if isinstance(x, jax.Array) and x.sharding == sharding:
    return x
  if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
    return jax.device_put(x, sharding)  # Across processes: a global array resharded by collectives.
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def param_shardings(family, config, mesh: Mesh, rules: Rules | None = None) -> tuple[Any, list[str]]:
  """(pytree of NamedSharding matching `family.init_params(config)`, notes on replicated dimensions)."""
  return tree_shardings(family.param_axes(config), family.param_shapes(config), mesh, resolve_rules(rules))


def shard(model, mesh: Mesh, rules=None):
  """`model` with every parameter placed on `mesh` by the logical-axis `rules` (None: `DEFAULT_RULES`; a dict
  overrides some names, e.g. {"vocab": None}). The model's arrays are not changed; a new Model is returned."""
  if not isinstance(mesh, Mesh):
    raise ValueError(f"shard: mesh must be a jax.sharding.Mesh (jaxspec.make_mesh(...)), got {type(mesh).__name__}.")
  shardings, _ = param_shardings(model.family, model.config, mesh, rules)
  params = jax.tree.map(place, model.params, shardings)
  return dataclasses.replace(model, params=params)


def mesh_of(params: Any) -> Mesh | None:
  """The mesh every parameter is placed on, or None when they are not all NamedSharding-placed on one mesh
  (parameters on one device, the unsharded case)."""
  meshes = {getattr(getattr(x, "sharding", None), "mesh", None) for x in jax.tree.leaves(params)}
  if len(meshes) != 1:
    return None
  mesh = meshes.pop()
  return mesh if isinstance(mesh, Mesh) else None


def rules_of(model, base: Rules = DEFAULT_RULES) -> Rules:
  """The rules `model`'s parameters were placed by; logical names only caches have ("batch", "cache_seq") keep
  `base`'s entry. Caches are placed by these, so they follow the weights (heads with heads)."""
  return infer_rules(model.family.param_axes(model.config), model.params, base)
