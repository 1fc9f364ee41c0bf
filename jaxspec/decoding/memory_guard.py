"""A check before allocating: what a `generate` call is about to allocate must fit its devices.

Without it, `max_new_tokens=10**6` preallocates tens of GB before doing anything and the kernel kills the
process. The bytes come from `jaxspec.sharding.memory_plan` (abstract evaluation: no allocation): per device, the caches,
the loop's state and the activations of the call's programs (the parameters are already resident); the free
memory from the devices that hold the target (`memory_stats()` on accelerators, MemAvailable on the CPU host).
"""

from __future__ import annotations

import jax

from jaxspec.errors import CacheTooLargeError
from jaxspec.sharding import DEFAULT_RULES, DRAFT_RULES
from jaxspec.sharding.memory_plan import memory_plan


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


def check_fits(settings, where, target, draft, batch: int, width: int, headroom: float = 0.9) -> None:
  """Raises CacheTooLargeError when a call's caches, loop state and activations need more than `headroom` of the
  free memory of a device that holds the target. Reads the call's placement; transfers nothing.

  Args:
    settings: the loop's static settings (max_new_tokens, slack: gamma or a tree's widest call, greedy).
    where: the call's `placement.Placement` (None on one device).
    target, draft: the call's target and draft model (None: no draft model).
    batch, width: the input ids' shape [B, S] before padding the batch to the mesh.
  """
  shape = (1, 1) if where is None else where.shape
  plan = memory_plan(target.config, shape, batch, width, settings.max_new_tokens, settings.slack, target.dtype,
                     draft=None if draft is None else draft.config,
                     rules=DEFAULT_RULES if where is None else where.target_rules,
                     draft_rules=DRAFT_RULES if where is None else where.draft_rules,
                     sampling=not settings.greedy)
  need = plan.caches + plan.state + plan.activations
  free = _least_free(where)
  if free is not None and need > headroom * free:
    raise CacheTooLargeError(
        f"the decoding caches and activations need {need / 2**30:.2f} GiB per device (batch {plan.batch}, "
        f"{settings.cache_len} positions per row after the input, gamma {settings.gamma}, mesh "
        f"data={shape[0]} x model={shape[1]}) but a device has {free / 2**30:.2f} GiB free: lower max_new_tokens, "
        f"the batch size or max_input_length, or spread the model over more devices (jaxspec.make_mesh).")
