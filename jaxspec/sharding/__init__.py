"""Scaling out with jax.sharding: a ("data", "model") mesh, logical-axis rules, and placing models on it.

See docs/scaling.md. Decoding a placed model needs nothing more: `jaxspec.generate` reads the mesh from the
target's parameters, splits the batch over `data` and shards the caches by the same rules.
"""

from jaxspec.sharding.mesh import (MESH_AXES, initialize_distributed, is_main_process, make_mesh, mesh_from_flag,
                                   parse_mesh)
from jaxspec.sharding.place import mesh_of, param_shardings, place, rules_of, shard
from jaxspec.sharding.rules import (DEFAULT_RULES, DRAFT_RULES, Rules, infer_rules, is_axes, local_shape,
                                    resolve_rules, spec_for, tree_shardings)

__all__ = ["DEFAULT_RULES", "DRAFT_RULES", "MESH_AXES", "Rules", "infer_rules", "initialize_distributed", "is_axes",
           "is_main_process", "local_shape", "make_mesh", "mesh_from_flag", "mesh_of", "param_shardings", "parse_mesh",
           "place", "resolve_rules", "rules_of", "shard", "spec_for", "tree_shardings"]
