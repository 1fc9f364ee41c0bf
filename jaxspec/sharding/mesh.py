"""The ("data", "model") device mesh, the `--mesh=data:D,model:M` flag's parser, and multi-host start-up.

    jaxspec.initialize_distributed()        # first thing in a launch script: joins the other hosts, if any
    mesh = jaxspec.make_mesh(model=8)       # every device of every process: data=1 x model=8
    mesh = mesh_from_flag("data:2,model:4") # the same from a flag ('' gives None: one device, unsharded)
    if jaxspec.is_main_process(): write(...)

`data` splits the batch (each data slice decodes its own rows), `model` splits the weights and the caches' heads
(each decoding step then all-reduces its activations over `model`). With neither given, `make_mesh` puts every
device on `model`: that fits the largest models; `jaxspec.memory_plan` tells whether a larger `data` fits too.
"""

from __future__ import annotations

import os
from typing import Sequence

import jax
from jax.sharding import AxisType, Mesh

from jaxspec.checks import check_int
from jaxspec.errors import SettingsError

MESH_AXES = ("data", "model")
DISTRIBUTED_ENV = "JAXSPEC_DISTRIBUTED"  # "1": call jax.distributed.initialize() (launch/tpu_pod.sh sets it).


def make_mesh(data: int | None = None, model: int | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 2-D mesh ("data", "model") over `devices` (default: every device of every process).

  A size left out fills the devices (data * model == number of devices); with neither given, data is 1.
  Raises SettingsError (a ValueError) when the sizes do not fill the devices exactly, or `devices` holds
  anything but `jax.Device`s.
  """
  if devices is not None and (isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__")):
    raise SettingsError(f"make_mesh: devices must be a list of jax.Device (e.g. jax.devices()[:4]), got "
                        f"{type(devices).__name__}.")
  devices = list(jax.devices() if devices is None else devices)
  bad = [d for d in devices if not isinstance(d, jax.Device)]
  if bad or not devices:
    raise SettingsError(f"make_mesh: devices must be a non-empty list of jax.Device (e.g. jax.devices()[:4]), "
                        f"got {bad[0]!r} ({type(bad[0]).__name__})." if bad else "make_mesh: devices is empty.")
  n = len(devices)
  for name, size in (("data", data), ("model", model)):
    if size is not None:
      check_int(size, f"make_mesh: {name}", 1)
  if data is None and model is None:
    data = 1
  if data is None or model is None:
    given, name = (data, "data") if model is None else (model, "model")
    if n % given:
      raise SettingsError(f"make_mesh: {name}={given} does not divide the {n} devices.")
    data, model = (given, n // given) if model is None else (n // given, given)
  if data * model != n:
    raise SettingsError(f"make_mesh: data={data} x model={model} = {data * model} devices, but {n} are given "
                     f"(pass devices=jax.devices()[:{data * model}] to use fewer).")
  # Auto axes: shardings propagate through the unannotated model code (GSPMD), as t5x and maxtext rely on.
  return jax.make_mesh((data, model), MESH_AXES, axis_types=(AxisType.Auto,) * 2, devices=devices)


def parse_mesh(spec: str) -> dict[str, int]:
  """'data:2,model:4' -> {'data': 2, 'model': 4}; '' -> {}. Raises ValueError naming the problem."""
  mesh: dict[str, int] = {}
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, _, size = part.partition(":")
    name = name.strip()
    if name not in MESH_AXES or name in mesh:
      raise ValueError(f"mesh {spec!r}: axis {name!r} is not one of {MESH_AXES} or is repeated "
                       f"(expected e.g. 'data:2,model:4').")
    if not size.strip().isdigit() or int(size) < 1:
      raise ValueError(f"mesh {spec!r}: axis {name!r} needs a size >= 1, got {size!r}.")
    mesh[name] = int(size)
  return mesh


def mesh_from_flag(spec: str) -> Mesh | None:
  """The mesh a `--mesh` value asks for ('' -> None: models stay on one device); a size left out fills the
  devices ('model:4' on 8 devices is data:2,model:4)."""
  sizes = parse_mesh(spec)
  return make_mesh(**sizes) if sizes else None


def _several_hosts() -> bool:
  """Whether the environment says this process is one of several (explicit flag, coordinator, Slurm, MPI)."""
  if os.environ.get(DISTRIBUTED_ENV, "") not in ("", "0"):
    return True
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    return True
  return any(int(os.environ.get(v, "1") or 1) > 1 for v in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> bool:
  """Joins the other processes through `jax.distributed.initialize` when there are any; returns True if joined.

  Call it before anything else touches JAX. With no arguments it initializes when the environment says the job
  spans several processes (JAXSPEC_DISTRIBUTED=1, as launch/tpu_pod.sh sets on a pod slice; JAX_COORDINATOR_ADDRESS;
  Slurm or Open MPI with more than one task) and lets JAX detect the rest (TPU pods, Slurm, MPI); on one host it
  does nothing. Arguments given are passed through (e.g. a localhost coordinator for tests).
  """
  if jax.distributed.is_initialized():
    return True
  explicit = any(a is not None for a in (coordinator_address, num_processes, process_id))
  if not explicit and not _several_hosts():
    return False
  if os.environ.get("JAX_PLATFORMS", "") == "cpu":  # CPU devices of several processes talk over gloo
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id)
  return True


def is_main_process() -> bool:
  """True on the process that writes outputs and logs (process 0); every process runs the same program."""
  return jax.process_index() == 0
