"""The slot engine's programs compiled and placed, as placement.py compiles and places `generate`'s: the jit of
each device program of device/slots.py (its static settings and donated state) and the slots' allocation (the
layout each prefilled leaf is written by, and the zero state allocated where it lives on a mesh: rows over `data`,
heads over `model` by each model's cache rules). jaxspec/serving/engine.py (`SlotEngine`) picks and runs them.

    layout, state = slot_programs.allocate(alloc, target_params, draft_params, slots, bucket, where)
    state, packed = slot_programs.STEP(step_program, target_params, draft_params, state, stop, index)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxspec.decoding import placement
from jaxspec.decoding.device import loop
from jaxspec.decoding.device.slots import (InsertProgram, Layout, SlotState, StepProgram, insert_program,
                                           step_program, wake_program, without_draft, zero_state)
from jaxspec.errors import SettingsError
from jaxspec.models import contract
from jaxspec.sharding import tree_shardings

__all__ = ["STEP", "INSERT", "WAKE", "allocate", "compiled_count", "InsertProgram", "Layout", "SlotState",
           "StepProgram", "without_draft"]

STEP = jax.jit(step_program, static_argnums=0, donate_argnums=3)
INSERT = jax.jit(insert_program, static_argnums=(0, 1), donate_argnums=4)
WAKE = jax.jit(wake_program, static_argnums=(0, 1), donate_argnums=3)


def compiled_count() -> int:
  """Programs compiled so far by every engine (step, insert and wake jits): a test of "nothing recompiles" reads it."""
  return STEP._cache_size() + INSERT._cache_size() + WAKE._cache_size()  # pylint: disable=protected-access


def allocate(alloc: loop.LoopSettings, target_params, draft_params, slots: int, top: int,
             where: placement.Placement | None, positions: int = 1) -> tuple[Layout, SlotState]:
  """The layout (per leaf: its declared batch axis, one row's padded shape, its sharding on the mesh) and the
  zero state of every slot (idle), allocated where it lives: rows over `data`, heads over `model` by each
  model's cache rules (the target's; a draft model's, else replicated over `model`), as `generate` places its
  batch. alloc: the settings of the largest slack (its drafter's init is every program's); top: the largest
  prompt bucket; where: `placement.plan` for `slots` rows (None: one device); positions: G, the draft positions of
  the verification budget's acceptance estimates ([slots, G] each)."""
  one = jax.eval_shape(functools.partial(loop.prefill, alloc), target_params, draft_params,
                       jax.ShapeDtypeStruct((1, top), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32))[:2]
  declared = (alloc.target.cache_axes(), alloc.drafter.state_axes())
  for names, shaped, what in zip(declared, one, ("the target's Decoder.cache_axes()",
                                                 "the drafter's Drafter.state_axes()")):
    if (jax.tree_util.tree_structure(names, is_leaf=contract.is_axes) != jax.tree_util.tree_structure(shaped) or
        any(len(n) != len(x.shape) for n, x in zip(jax.tree_util.tree_leaves(names, is_leaf=contract.is_axes),
                                                   jax.tree_util.tree_leaves(shaped)))):
      raise SettingsError(f"{what} does not match the state its prefill returns: every array needs its tuple of "
                          f"axis names.")
  axes = contract.batch_axes(declared)
  leaves, cache_tree = jax.tree_util.tree_flatten(one)
  seq_axes = tuple(names.index("cache_seq") if "cache_seq" in names else None
                   for names in jax.tree_util.tree_leaves(declared[0], is_leaf=contract.is_axes))
  seq_axes += (None,) * (len(leaves) - len(seq_axes))  # the drafter's state is always gathered whole
  layout = Layout(axes=axes, shapes=tuple(tuple(s.shape) for s in leaves), seq_axes=seq_axes)
  full = contract.with_rows(leaves, axes, slots)
  n, seq_len, pad = slots, alloc.seq_len, alloc.pad_id
  out_shardings = None
  if where is not None:  # per-slot arrays and the target's cache by the target's rules, the drafter's by its own
    cache, draft = jax.tree_util.tree_unflatten(cache_tree, full)
    rows = {f.name: ((n,), ("batch",)) for f in dataclasses.fields(SlotState)
            if f.name not in ("target_cache", "draft_state")} | {"sequences": ((n, seq_len), ("batch", "sequence"))}
    rows |= {name: ((n, positions), ("batch", "draft_position")) for name in ("est_sum", "est_count", "est_prior")}
    target_rows, _ = tree_shardings(({k: a for k, (_, a) in rows.items()}, declared[0]),
                                    ({k: s for k, (s, _) in rows.items()}, cache), where.mesh, where.target_rules)
    draft_shardings, _ = tree_shardings(declared[1], draft, where.mesh, where.draft_rules)
    out_shardings = SlotState(**target_rows[0], target_cache=target_rows[1], draft_state=draft_shardings)
    layout = dataclasses.replace(layout, shardings=tuple(jax.tree_util.tree_leaves(out_shardings)))
  zeros = jax.jit(functools.partial(zero_state, n, seq_len, pad, positions, cache_tree, full), out_shardings=out_shardings)
  return layout, zeros()
