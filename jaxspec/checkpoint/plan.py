"""`jaxspec.memory_plan`: `jaxspec.sharding.memory_plan.memory_plan` over configs read from model directories too.

The planner itself (sharding/) takes configs, Models and public T5 shape names; reading a directory's config.json
(or a Hub name's, or an embedded model's) is this layer's, so it happens here before the plan is made.
"""

from __future__ import annotations

import functools

from jaxspec.checkpoint import io
from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec.sharding import memory_plan as planner


def config_of(name_or_config):
  """A config from a config object, a Model, a public T5 shape name ('t5-11b') or a model directory / name (only
  its config.json is read)."""
  if isinstance(name_or_config, str) and name_or_config not in T5_SHAPES:
    directory, _ = io._resolve(name_or_config, None, None)  # pylint: disable=protected-access
    return io.read_config(directory)[1]
  return planner.config_of(name_or_config)


@functools.wraps(planner.memory_plan)
def memory_plan(config_or_model, *args, draft=None, **kwargs) -> planner.MemoryPlan:
  return planner.memory_plan(config_of(config_or_model), *args, draft=None if draft is None else config_of(draft),
                             **kwargs)


memory_plan.__doc__ = planner.memory_plan.__doc__.replace(
    "configs, Models or public T5 shape names ('t5-small' ... 't5-11b'); draft None:\n      plain decoding. "
    "(`jaxspec.memory_plan` also takes model directories and names: it reads their config.json.)",
    "configs, Models, public T5 shape names ('t5-small' ... 't5-11b') or model\n      directories and names "
    "(only config.json is read). draft None: plain decoding.")

__all__ = ["config_of", "memory_plan"]
