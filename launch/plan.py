r"""Prints the memory plan of a decoding run on a device mesh, and whether it fits a device's memory.

    python launch/plan.py --model=t5-11b --draft=t5-small --mesh=model:8 --batch=32 --device=tpu-v5e-8
    python launch/plan.py --model=/path/to/hf_dir --mesh=data:2,model:4 --device_gib=16

--model and --draft: a public T5 shape name (t5-small ... t5-11b), an embedded model name or a model directory
(only config.json is read: nothing is loaded or allocated). --device: a device kind (tpu-v5e, h100-80gb, ...) or a
machine (tpu-v5e-8, tpu-v4-8, 8xh100, ...), whose device count fills a mesh axis left out of --mesh; a mesh of
more devices than the machine has is refused. Errors (a bad number, a mesh, a broken config.json) end with one line.
"""

import math

from absl import flags

from jaxspec import sharding
from jaxspec.cli import flags as cli_flags
from jaxspec.errors import SettingsError
from jaxspec.checkpoint.plan import memory_plan
from jaxspec.sharding.memory_plan import DEVICE_MEMORY, MACHINES, GiB

_MODEL = flags.DEFINE_string("model", "t5-11b", "Target: a T5 shape name, an embedded name or a model directory.")
_DRAFT = flags.DEFINE_string("draft", "t5-small", "Draft ('' = plain decoding).")
_MESH = flags.DEFINE_string("mesh", "", "Mesh 'data:D,model:M'; an axis left out fills the --device machine.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows per generate call.", lower_bound=1)
_INPUT = flags.DEFINE_integer("max_input_length", 128, "Input positions (the encoder / prompt bucket).", lower_bound=1)
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens generated per row at most.", lower_bound=1)
_GAMMA = flags.DEFINE_integer("gamma", 7, "Draft tokens per iteration.", lower_bound=0)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16", "float32"], "Parameter dtype.")
_GREEDY = flags.DEFINE_boolean("greedy", False, "Greedy decoding (no sampled distributions held).")
_DEVICE = flags.DEFINE_string("device", "", "Device kind or machine: " + ", ".join(
    sorted(DEVICE_MEMORY) + sorted(MACHINES)))
_GIB = flags.DEFINE_float("device_gib", 0.0, "Memory per device in GiB (overrides --device's; 0 = --device's).")
flags.register_validator("device_gib", lambda v: math.isfinite(v) and v >= 0,
                         message="--device_gib must be a finite number of GiB >= 0 (0 = --device's memory)")


def _mesh_shape(devices: int | None) -> tuple[int, int]:
  try:
    sizes = sharding.parse_mesh(_MESH.value)
  except ValueError as e:
    raise SettingsError(f"--mesh={_MESH.value}: {e}") from None
  data, model = sizes.get("data"), sizes.get("model")
  if devices and (data or 1) * (model or 1) > devices:
    raise SettingsError(f"--mesh={_MESH.value} needs {(data or 1) * (model or 1)} devices, but "
                        f"--device={_DEVICE.value} has {devices}.")
  if devices and (data is None) != (model is None):
    given = data or model
    if devices % given:
      raise SettingsError(f"--mesh {_MESH.value!r} does not divide the {devices} devices of --device.")
    data, model = (data, devices // data) if data else (devices // model, model)
  elif devices and data is None:
    data, model = 1, devices
  return data or 1, model or 1


def main(argv):
  del argv
  kind, devices = MACHINES.get(_DEVICE.value, (_DEVICE.value, None))
  if kind and kind not in DEVICE_MEMORY:
    raise SettingsError(f"--device {_DEVICE.value!r}: expected one of {sorted(DEVICE_MEMORY)} or "
                         f"{sorted(MACHINES)}.")
  shape = _mesh_shape(devices)
  plan = memory_plan(_MODEL.value, shape, _BATCH.value, _INPUT.value, _NEW.value, _GAMMA.value, _DTYPE.value,
                        draft=_DRAFT.value or None, sampling=not _GREEDY.value)
  print(f"{_MODEL.value}" + (f" + {_DRAFT.value}" if _DRAFT.value else "") + f", {_DTYPE.value}, input "
        f"{_INPUT.value}, {_NEW.value} new tokens, gamma {_GAMMA.value}")
  print(plan.table())
  memory = int(_GIB.value * GiB) if _GIB.value else DEVICE_MEMORY.get(kind)
  if memory:
    name = f"{_GIB.value:g} GiB devices" if _GIB.value else f"{kind} ({memory / GiB:.1f} GiB per device)"
    verdict = "fits" if plan.fits(memory) else "does not fit"
    print(f"{verdict} on {name}: {100 * plan.total / memory:.0f}% of a device's memory (90% usable)")


if __name__ == "__main__":
  cli_flags.run(main)
