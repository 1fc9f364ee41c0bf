"""A check before allocating: what a `generate` call is about to allocate must fit its devices.

Without it, `max_new_tokens=10**6` preallocates tens of GB before doing anything and the kernel kills the
process. The bytes come from `jaxspec.sharding.memory_plan` (abstract evaluation: no allocation): per device, the caches,
the loop's state and the activations of the call's programs (the parameters are already resident), with the
loop's own shape for every drafter (`loop_shape`: a chain's or a tree's verify call and its logits, the sampled
distributions, and the drafter's state: a head's cache and a T5 head's encoder keys / values, the lookup context); the free
memory from the devices that hold the target (`memory_stats()` on accelerators, MemAvailable on the CPU host).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxspec.errors import CacheTooLargeError
from jaxspec.sharding import DEFAULT_RULES, DRAFT_RULES
from jaxspec.sharding.memory_plan import LoopShape, memory_plan, most_that_fit


def free_bytes(device: jax.Device | None = None) -> int | None:
  """Free memory of `device` in bytes, or None when it cannot be told."""
  device = device or jax.local_devices()[0]
  if device.platform == "cpu":
    try:
      with open("/proc/meminfo") as f:
        for line in f:
          if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    except OSError:
      return None
    return None
  try:
    stats = device.memory_stats() or {}
  except Exception:  # Some backends do not implement memory_stats.
    return None
  if "bytes_limit" not in stats:
    return None
  return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def _least_free(where) -> int | None:
  """The least free memory over this process's devices that hold the target (None when none can be told)."""
  mesh = None if where is None else where.mesh
  devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()] if mesh is not None else [None]
  if mesh is not None and devices and devices[0].platform == "cpu":
    devices = devices[:1]  # Simulated CPU devices share the host's memory.
  free = [f for f in (free_bytes(d) for d in devices) if f is not None]
  return min(free) if free else None


def _signature(tree) -> tuple:
  """A hashable (treedef, shapes and dtypes) of a pytree of arrays (None for no pytree)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


@functools.lru_cache(maxsize=64)
def _drafter_state_bytes(settings, target_sig, draft_sig, batch: int, width: int) -> int:
  """Bytes of the drafter's state after the loop's prefill (an abstract evaluation of `loop.prefill`: nothing is
  allocated), over the whole batch."""
  from jaxspec.decoding.device import loop  # pylint: disable=import-outside-toplevel
  abstract = lambda sig: None if sig is None else jax.tree.unflatten(
      sig[0], [jax.ShapeDtypeStruct(s, d) for s, d in sig[1]])
  ids = jax.ShapeDtypeStruct((batch, width), jnp.int32)
  lengths = jax.ShapeDtypeStruct((batch,), jnp.int32)
  _, state, _ = jax.eval_shape(lambda t, d, i, n: loop.prefill(settings, t, d, i, n), abstract(target_sig),
                               abstract(draft_sig), ids, lengths)
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state))


def loop_shape(settings, target_params, draft_params, draft_is_model: bool, batch: int, width: int,
               data: int = 1) -> LoopShape:
  """The loop's own memory beyond plain decoding (`memory_plan.LoopShape`), from its static settings and its
  drafter: the slack, the verify call's width (a chain's gamma + 1, a tree's N + 1 nodes with their [B, N, C]
  mask), the sampled distributions, the features the drafter reads and the drafter's own state (per device: rows
  split over `data`; a draft model's cache is planned with its model)."""
  tree = settings.tree
  verify = settings.gamma + 1 if tree is None else tree.nodes + 1
  rows = 0 if settings.greedy else (2 * settings.gamma + 1 if tree is None else 2 * verify)
  state = 0
  if not draft_is_model:
    state = _drafter_state_bytes(settings, _signature(target_params), _signature(draft_params), batch, width)
    state = -(-state // data)
  return LoopShape(slack=settings.slack, verify_tokens=verify, tree=tree is not None, sampled_rows=rows,
                   layers=settings.drafter.feature_layers, drafter_state=state)


def _need(settings, where, target, source, batch: int, width: int, prefill_rows: int | None = None,
          slack: int | None = None):
  """(memory plan, bytes per device beyond the resident parameters: caches, loop state, activations) of a call of
  `batch` rows (`where.batch` on a mesh: padded) and inputs of `width` positions."""
  draft = source.model
  shape = (1, 1) if where is None else where.shape
  padded = batch if where is None else where.batch
  loop = loop_shape(settings, target.params, source.params, draft is not None, padded, width, shape[0])
  if slack is not None:  # caches allocated for another program's slack (a slot engine's largest)
    loop = dataclasses.replace(loop, slack=slack)
  plan = memory_plan(target.config, shape, batch, width, settings.max_new_tokens, settings.gamma, target.dtype,
                     draft=None if draft is None else draft.config,
                     rules=DEFAULT_RULES if where is None else where.target_rules,
                     draft_rules=DRAFT_RULES if where is None else where.draft_rules,
                     sampling=not settings.greedy, loop=loop, prefill_rows=prefill_rows)
  return plan, plan.caches + plan.state + plan.activations


def check_fits(settings, where, target, source, batch: int, width: int, headroom: float = 0.9) -> None:
  """Raises CacheTooLargeError when a call's caches, loop state and activations need more than `headroom` of the
  free memory of a device that holds the target. Reads the call's placement; transfers nothing.

  Args:
    settings: the loop's static settings (max_new_tokens, slack: gamma or a tree's widest call, greedy, the tree,
      the drafter: its features and state are counted for every drafter, `loop_shape`).
    where: the call's `placement.Placement` (None on one device).
    target: the call's target; source: its `drafter.DraftSource` (a draft model is planned with its config,
      any other drafter by its state).
    batch, width: the input ids' shape [B, S] before padding the batch to the mesh.
  """
  plan, need = _need(settings, where, target, source, batch, width)
  shape = (1, 1) if where is None else where.shape
  free = _least_free(where)
  if free is not None and need > headroom * free:
    raise CacheTooLargeError(
        f"the decoding caches and activations need {need / 2**30:.2f} GiB per device (batch {plan.batch}, "
        f"{settings.cache_len} positions per row after the input, gamma {settings.gamma}, mesh "
        f"data={shape[0]} x model={shape[1]}) but a device has {free / 2**30:.2f} GiB free: lower max_new_tokens, "
        f"the batch size or max_input_length, or spread the model over more devices (jaxspec.make_mesh).")


def slots_need(programs, where, target, source, slots: int, width: int, gathered: int = 0) -> int:
  """Bytes per device a slot engine of `slots` rows needs beyond its resident parameters: the slots' caches and
  state (every program on the caches of the largest slack, as allocated) and the largest program's activations (a
  step over the slots, or an insert's batch-1 prefill: inserts prefill one request each);
  `gathered` > 0: a step decoding that many rows gathered from the slots also holds their copy and its own
  activations. programs: the loop settings of every step program (every table entry and sampling mode);
  where: the slots' `placement.Placement` (None on one device; its batch is replaced by `slots`)."""
  def need(rows: int) -> tuple[int, int]:
    at = None if where is None else dataclasses.replace(where, batch=rows)
    slack = max(s.slack for s in programs)  # every program runs on the caches allocated for the largest
    plans = [_need(s, at, target, source, rows, width, prefill_rows=1, slack=slack) for s in programs]
    held = max(p.caches + p.state for p, _ in plans)
    return held, max(n for _, n in plans)

  held, full = need(slots)
  if gathered <= 0 or gathered >= slots:
    return full
  return max(full, held + need(gathered)[1])


def check_slots(programs, where, target, source, slots: int, width: int, gathered=lambda n: 0,
                headroom: float = 0.9) -> None:
  """Raises CacheTooLargeError, before a slot engine allocates anything, when `slots_need` is more than
  `headroom` of a device's free memory; the one-line message names --slots and the most slots that fit at
  these lengths (a multiple of the mesh's `data` axis). gathered(n): the most rows a step of an engine of n slots
  gathers (its largest row bucket below n; 0 for none)."""
  free = _least_free(where)
  if free is None:
    return
  budget = headroom * free
  step = 1 if where is None else where.data
  need_of = lambda n: slots_need(programs, where, target, source, n, width, gathered(n))
  need = need_of(slots)
  if need <= budget:
    return
  low = most_that_fit(need_of, budget, slots, step=step, limit=slots)
  settings = max(programs, key=lambda s: s.slack)
  most = (f"at most {low} slots fit at these lengths" if low else
          "not even " + (f"{step} slots (one per data device) fit" if step > 1 else "one slot fits") +
          " at these lengths: lower --max_new_tokens or --max_input_length")
  raise CacheTooLargeError(
      f"--slots={slots} needs {need / 2**30:.2f} GiB per device for the slots' caches, state and a step "
      f"({width} input positions + {settings.cache_len} per slot, mesh data={step} x model="
      f"{1 if where is None else where.shape[1]}) but a device has {free / 2**30:.2f} GiB free: {most}.")
