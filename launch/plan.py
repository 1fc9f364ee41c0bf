r"""Prints the memory plan of a decoding run on a device mesh, and whether it fits a device's memory.

    python launch/plan.py --model=t5-11b --draft=t5-small --mesh=model:8 --batch=32 --device=tpu-v5e-8
    python launch/plan.py --model=/path/to/hf_dir --mesh=data:2,model:4 --device_gib=16
    python launch/plan.py --model=t5-11b --draft=t5-small --mesh=data:2,model:4 --device=tpu-v5e-8 --slots=64

--slots > 0 plans a server (launch/serve.py --slots): the slots' caches and state at the input bucket of
--max_input_length, --max_new_tokens and gamma's slack, the widest step (every slot decoded, or the largest row
bucket gathered beside them), and the most slots that fit a device at these lengths (a multiple of `data`): what
the slot engine checks before it allocates.

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
from jaxspec.sharding.memory_plan import DEVICE_MEMORY, MACHINES, GiB, most_that_fit

_MODEL = flags.DEFINE_string("model", "t5-11b", "Target: a T5 shape name, an embedded name or a model directory.")
_DRAFT = flags.DEFINE_string("draft", "t5-small", "Draft ('' = plain decoding).")
_MESH = flags.DEFINE_string("mesh", "", "Mesh 'data:D,model:M'; an axis left out fills the --device machine.")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows per generate call.", lower_bound=1)
_INPUT = flags.DEFINE_integer("max_input_length", 128, "Input positions (the encoder / prompt bucket).", lower_bound=1)
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens generated per row at most.", lower_bound=1)
_GAMMA = flags.DEFINE_integer("gamma", 7, "Draft tokens per iteration.", lower_bound=0)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16", "float32"], "Parameter dtype.")
_SLOTS = flags.DEFINE_integer("slots", 0, "A server's slots (launch/serve.py --slots): 0 plans a generate call of "
                              "--batch rows; > 0 the slot engine's memory and the most slots that fit.", lower_bound=0)
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


def _serving(shape: tuple[int, int], memory: int | None, name: str) -> None:
  """The serving plan: --slots' bytes per device at the engine's lengths, and the most slots that fit."""
  from jaxspec.decoding.arguments import bucket_length  # pylint: disable=import-outside-toplevel
  data, slots = shape[0], _SLOTS.value
  if slots % data:
    raise SettingsError(f"--slots={slots} is not a multiple of the mesh's data axis ({data}).")
  bucket = bucket_length(_INPUT.value, _INPUT.value)

  def plan(rows: int):
    return memory_plan(_MODEL.value, shape, rows, bucket, _NEW.value, _GAMMA.value, _DTYPE.value,
                       draft=_DRAFT.value or None, sampling=not _GREEDY.value, prefill_rows=1)

  def peak(rows: int) -> int:  # every slot decoded, or the largest row bucket below `rows` gathered beside them
    full = plan(rows)
    gathered = max((b for b in (data * 2 ** i for i in range(rows.bit_length())) if b < rows), default=0)
    if not gathered:
      return full.total
    step = plan(gathered)
    return full.total + max(0, step.caches + step.state + step.activations - full.activations)

  full = plan(slots)
  print(f"serving plan: {slots} slots (launch/serve.py --slots={slots}), input bucket {bucket}, {_NEW.value} new "
        f"tokens + gamma {_GAMMA.value} per slot")
  print(full.table())
  need = peak(slots)
  print(f"  peak with a step's gathered rows: {need / GiB:.3f} GiB per device")
  if memory:
    budget = 0.9 * memory
    most = most_that_fit(peak, budget, slots, step=data, limit=2**20 * data)
    verdict = "fits" if need <= budget else "does not fit"
    print(f"{verdict} on {name} (90% usable); at most {most} slots fit at these lengths")


def main(argv):
  del argv
  kind, devices = MACHINES.get(_DEVICE.value, (_DEVICE.value, None))
  if kind and kind not in DEVICE_MEMORY:
    raise SettingsError(f"--device {_DEVICE.value!r}: expected one of {sorted(DEVICE_MEMORY)} or "
                         f"{sorted(MACHINES)}.")
  shape = _mesh_shape(devices)
  memory = int(_GIB.value * GiB) if _GIB.value else DEVICE_MEMORY.get(kind)
  name = f"{_GIB.value:g} GiB devices" if _GIB.value else f"{kind} ({(memory or 0) / GiB:.1f} GiB per device)"
  if _SLOTS.value:
    print(f"{_MODEL.value}" + (f" + {_DRAFT.value}" if _DRAFT.value else "") + f", {_DTYPE.value}, mesh "
          f"data={shape[0]} x model={shape[1]}")
    _serving(shape, memory, name)
    return
  plan = memory_plan(_MODEL.value, shape, _BATCH.value, _INPUT.value, _NEW.value, _GAMMA.value, _DTYPE.value,
                        draft=_DRAFT.value or None, sampling=not _GREEDY.value)
  print(f"{_MODEL.value}" + (f" + {_DRAFT.value}" if _DRAFT.value else "") + f", {_DTYPE.value}, input "
        f"{_INPUT.value}, {_NEW.value} new tokens, gamma {_GAMMA.value}")
  print(plan.table())
  if memory:
    verdict = "fits" if plan.fits(memory) else "does not fit"
    print(f"{verdict} on {name}: {100 * plan.total / memory:.0f}% of a device's memory (90% usable)")


if __name__ == "__main__":
  cli_flags.run(main)
