"""absl flags shared by the launch scripts, validated when the command line is parsed (before any model loads).

    cli_flags.define_models()          # --target, --draft
    cli_flags.define_decoding(gamma=3) # --gamma, --tree, --max_new_tokens, --max_input_length, --batch_size
                                       # (auto_gamma=True: --gamma and --tree also take 'auto', measured)
    cli_flags.define_sampling()        # --temperature, --top_k, --top_p, --seed
    cli_flags.sampling(), cli_flags.speculation(draft), cli_flags.run_kwargs()  # the parsed flags, typed
    cli_flags.define_mesh()            # --mesh data:D,model:M
    cli_flags.run(main)                # app.run, with user errors printed as one line and exit status 1,
                                       # and two start-up lines that are not the user's (STARTUP_NOISE) dropped

A bad value stops the script at parsing with one line ("FATAL Flags parsing error: flag --batch_size=0: ...") and
exit status 1. `run` does the same for the library's user errors raised later (an unreadable input, an unknown
model, an output that does not belong to the input): one line on stderr, no traceback.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from typing import Callable

from absl import app, flags
from ml_collections import config_flags

from jaxspec.checks import MAX_SEED
from jaxspec.errors import JaxspecError, SettingsError

FLAGS = flags.FLAGS
AUTO = "auto"  # --gamma=auto


def _check(name: str, ok: Callable, message: str) -> None:
  flags.register_validator(name, ok, message=f"--{name} {message}")


def define_config_file(name: str, default: str | None, help_text: str):
  """config_flags.DEFINE_config_file(..., lock_config=True); an override of a field the config does not have
  (--config.no_such_field=1, which ml_collections rejects while defining the flag) ends with one line."""
  try:
    return config_flags.DEFINE_config_file(name, default, help_text, lock_config=True)
  except (AttributeError, KeyError) as e:
    given = [a.split("=")[0] for a in sys.argv[1:] if a.startswith(f"--{name}.")]
    print(f"FATAL Flags parsing error: {', '.join(given) or '--' + name}: no such field in the config ({e}).",
          file=sys.stderr)
    sys.exit(1)


def define_models(target: str = "ende-target", draft: str | None = "ende-draft") -> None:
  """--target and (unless draft is None) --draft: embedded model names or model directories."""
  flags.DEFINE_string("target", target, "Target model: an embedded name or a model directory.")
  if draft is not None:
    flags.DEFINE_string("draft", draft, "Draft: an embedded name, a model directory, an EAGLE-3 head directory "
                        "(trained on --target) or 'ngram' (prompt lookup, no model); '' = plain decoding. "
                        "Comma-separated where a script takes a pool (translate.py).")
  _check("target", lambda v: bool(v), "must name a model")


class _GammaParser(flags.ArgumentParser):
  """An integer >= 1, or 'auto' (the launch script measures the best choice: `jaxspec.cli.jobs.calibrate`).
  advertise=False: 'auto' is parsed (so that a validator can say where it belongs) but not offered in the help."""

  def __init__(self, advertise: bool = True):
    self.advertise = advertise

  def parse(self, argument):
    if argument == AUTO or (isinstance(argument, int) and argument >= 1):
      return argument
    try:
      value = int(str(argument))
    except ValueError:
      value = 0
    if value < 1:
      raise ValueError(f"expected an {self.flag_type()}, got {argument!r}")
    return value

  def flag_type(self) -> str:
    return f"integer >= 1 or '{AUTO}'" if self.advertise else "integer >= 1"


class _TreeParser(flags.ArgumentParser):
  """'' (chains), 'K,N' (a `jaxspec.Tree(top_k=K, nodes=N)`, checked as it is made), or with auto 'auto'."""

  def __init__(self, auto: bool, advertise: bool = True):
    self.auto, self.advertise = auto, advertise

  def parse(self, argument):
    import jaxspec  # pylint: disable=import-outside-toplevel
    if argument is None or isinstance(argument, jaxspec.Tree):
      return argument
    text = str(argument).strip()
    if text in ("", "none"):
      return None
    if text == AUTO and self.auto:
      return AUTO
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
      raise ValueError(f"expected 'K,N' (top_k, nodes){f' or {AUTO!r}' if self.auto else ''}, got {argument!r}")
    return jaxspec.Tree(top_k=int(parts[0]), nodes=int(parts[1]))  # SettingsError (a ValueError) names the field

  def flag_type(self) -> str:
    return "'K,N' (top_k,nodes)" + (f" or '{AUTO}'" if self.auto and self.advertise else "")


def parse_trees(spec: str) -> list:
  """'K,N:K,N' -> [jaxspec.Tree(K, N), ...] ('' -> []); a SettingsError names a bad shape."""
  import jaxspec  # pylint: disable=import-outside-toplevel
  out = []
  for part in (p for p in spec.split(":") if p.strip()):
    k, _, n = part.partition(",")
    if not (k.strip().isdigit() and n.strip().isdigit()):
      raise SettingsError(f"expected tree shapes 'K,N' (top_k, nodes) separated by ':', got {part!r}.")
    out.append(jaxspec.Tree(top_k=int(k), nodes=int(n)))
  return out


def define_decoding(gamma: int | str = 3, batch_size: int = 1, max_new_tokens: int = 64,
                    max_input_length: int = 128, gamma_flag: bool = True, auto_gamma: bool = False,
                    advertise_auto: bool = True) -> None:
  """--gamma (an integer >= 1; with auto_gamma also 'auto'), --tree ('' for chains, 'K,N'; with auto_gamma also
  'auto'), --max_new_tokens, --max_input_length and --batch_size, each an integer >= 1. advertise_auto=False
  parses 'auto' without offering it in the help (a script whose validator refuses it, pointing elsewhere). A
  --tree deeper than --gamma's depth allows (`Tree.check_depth`) stops at parsing."""
  offer = auto_gamma and advertise_auto
  if gamma_flag and auto_gamma:
    flags.DEFINE(_GammaParser(advertise_auto), "gamma", gamma, "Draft tokens per iteration" + (
        f", or '{AUTO}': measure drafts x gammas x schedules on the first inputs and use the fastest (plain "
        "decoding when none wins)." if offer else "."))
  elif gamma_flag:  # 'auto' parses, to be refused naming where it belongs (not int()'s "invalid literal")
    flags.DEFINE(_GammaParser(advertise=False), "gamma", gamma, "Draft tokens per iteration.")
    _check("gamma", lambda v: v != AUTO, f"takes an integer >= 1 here ('{AUTO}', a measured choice, is "
           "launch/translate.py's)")
  if gamma_flag:
    flags.DEFINE(_TreeParser(auto_gamma, advertise_auto), "tree", None, "Token trees (a draft model, an EAGLE-3 "
                 "head or ngram): 'K,N' drafts a tree of depth --gamma (at most N), expanding the K best nodes per "
                 "depth and keeping the N best (jaxspec.Tree(top_k=K, nodes=N)); '' drafts chains" + (
                     f"; '{AUTO}' times chains and a few tree shapes on the first inputs and uses the fastest."
                     if offer else "."))
    flags.register_multi_flags_validator(["gamma", "tree"], _tree_fits_gamma)
  flags.DEFINE_integer("max_new_tokens", max_new_tokens, "Tokens generated per input at most.", lower_bound=1)
  flags.DEFINE_integer("max_input_length", max_input_length, "Longest input in tokens (EOS included).",
                       lower_bound=1)
  flags.DEFINE_integer("batch_size", batch_size, "Inputs per generate call (one compilation per prompt bucket).",
                       lower_bound=1)


def _tree_fits_gamma(values: dict) -> bool:
  """--tree K,N with an integer --gamma: the shape must suit that depth (`jaxspec.Tree.check_depth`)."""
  import jaxspec  # pylint: disable=import-outside-toplevel
  tree, gamma = values["tree"], values["gamma"]
  if isinstance(tree, jaxspec.Tree) and isinstance(gamma, int):
    try:
      tree.check_depth(gamma)
    except ValueError as e:
      raise flags.ValidationError(f"--tree={tree.top_k},{tree.nodes} with --gamma={gamma}: {e}") from None
  return True


def define_sampling() -> None:
  """--temperature, --top_k, --top_p and --seed (per-item seeds derive from it: `jaxspec.tools.batching.item_seed`)."""
  flags.DEFINE_float("temperature", 0.0, "0 = greedy (exactly the target's greedy output); > 0 samples.")
  flags.DEFINE_integer("top_k", 0, "Top-k sampling (0 = off).", lower_bound=0)
  flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass in (0, 1] (1 = off).")
  flags.DEFINE_integer("seed", 0, "Base sampling seed in [0, 2**31 - 1]; item i samples with a seed derived from "
                       "it and i, so batch size and resume points never change an output.", lower_bound=0,
                       upper_bound=MAX_SEED)
  _check("temperature", lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0 (0 = greedy)")
  _check("top_p", lambda v: 0 < v <= 1, "must be in (0, 1] (1 = off)")


class _NumberListParser(flags.ArgumentParser):
  """Comma-separated numbers of one kind, each >= lower_bound: '1,2,3' -> [1, 2, 3]."""

  def __init__(self, kind: type, lower_bound: float):
    self.kind, self.lower_bound = kind, lower_bound

  def parse(self, argument):
    if isinstance(argument, (list, tuple)):
      return list(argument)
    try:
      values = [self.kind(x) for x in str(argument).split(",") if x.strip()]
    except ValueError:
      raise ValueError(f"expected comma-separated {self.kind.__name__} values, got {argument!r}") from None
    if not values or not all(math.isfinite(v) and v >= self.lower_bound for v in values):
      raise ValueError(f"expected one or more {self.kind.__name__} values >= {self.lower_bound}, got {argument!r}")
    return values

  def flag_type(self) -> str:
    return f"comma-separated list of {self.kind.__name__}"


def define_number_list(name: str, default: list, help_text: str, kind: type = int, lower_bound: float = 0) -> None:
  """--name=1,2,3 as a list of `kind` values, each >= lower_bound (parsed and checked with the command line)."""
  flags.DEFINE(_NumberListParser(kind, lower_bound), name, default, help_text,
               serializer=flags.CsvListSerializer(","))


def parse_mesh(spec: str) -> dict[str, int]:
  """'data:2,model:4' -> {'data': 2, 'model': 4}; '' -> {} (one device). Raises ValueError naming the problem."""
  from jaxspec.sharding import parse_mesh as parse  # pylint: disable=import-outside-toplevel
  try:
    return parse(spec)
  except ValueError as e:
    raise ValueError(f"--{e}") from None


def _mesh_ok(spec: str) -> bool:
  try:
    parse_mesh(spec)
  except ValueError as e:
    raise flags.ValidationError(str(e)) from None
  return True


def define_mesh() -> None:
  """--mesh: device mesh axes 'data:D,model:M' (see jaxspec.sharding.make_mesh)."""
  flags.DEFINE_string("mesh", "", "Device mesh 'data:D,model:M' over every device of every process ('' = one "
                      "device, unsharded; a size left out fills the devices, e.g. 'model:8').")
  flags.register_validator("mesh", _mesh_ok)
  flags.DEFINE_string("coordinator_address", "", "host:port of process 0's coordinator, for a job of several "
                      "processes ('' = from the environment: TPU pods, JAXSPEC_DISTRIBUTED=1, Slurm, Open MPI).")
  flags.DEFINE_integer("num_processes", 0, "Processes in the job (0 = from the environment).", lower_bound=0)
  flags.DEFINE_integer("process_id", -1, "This process's index in [0, --num_processes) (-1 = from the "
                       "environment).", lower_bound=-1)


def mesh():
  """Joins the other processes when the job spans several (jaxspec.initialize_distributed: --coordinator_address,
  --num_processes and --process_id when given, else the environment), then returns the Mesh that --mesh asks for,
  or None for one device. Call it first in main(), before anything else touches JAX."""
  from jaxspec import sharding  # pylint: disable=import-outside-toplevel
  count, index = FLAGS.num_processes or None, (None if FLAGS.process_id < 0 else FLAGS.process_id)
  if count is not None and index is not None and index >= count:
    raise SettingsError(f"--process_id={index} is not below --num_processes={count}.")
  sharding.initialize_distributed(FLAGS.coordinator_address or None, count, index)
  try:
    return sharding.mesh_from_flag(FLAGS.mesh)
  except ValueError as e:  # e.g. a size that does not divide the devices there are
    raise SettingsError(f"--mesh={FLAGS.mesh}: {e}") from None


def sampling():
  """--temperature, --top_k and --top_p as a `jaxspec.Sampling` (greedy when the script defines none)."""
  import jaxspec  # pylint: disable=import-outside-toplevel
  names = ("temperature", "top_k", "top_p")
  return jaxspec.Sampling(**{n: FLAGS[n].value for n in names if n in FLAGS})


def speculation(draft):
  """A `jaxspec.Speculation` of `draft` with --gamma and --tree (None when draft is None: plain decoding)."""
  import jaxspec  # pylint: disable=import-outside-toplevel
  tree = FLAGS.tree if "tree" in FLAGS else None
  if draft is None:
    return None
  return jaxspec.Speculation(draft, gamma=FLAGS.gamma, tree=None if tree == AUTO else tree)


def run_kwargs() -> dict:
  """--max_new_tokens, --max_input_length, --batch_size and --seed as keyword arguments of
  `batching.generate_all` (those the script defines)."""
  names = ("max_new_tokens", "max_input_length", "batch_size", "seed")
  return {n: FLAGS[n].value for n in names if n in FLAGS}


# Start-up lines that say nothing about the user's job, each dropped by its logger, its level and its text (every
# other record of those loggers, warnings above all, still shows): (logger, highest level dropped, message start).
STARTUP_NOISE = (
    ("jax._src.xla_bridge", logging.INFO, "Unable to initialize backend"),  # JAX probing for a TPU / GPU it lacks
    ("transformers", logging.WARNING, "PyTorch was not found"),  # transformers imported for a tokenizer only
)


class _DropStartupNoise(logging.Filter):
  """Drops a logger's records at or below `level` whose message starts with `prefix`."""

  def __init__(self, level: int, prefix: str):
    super().__init__()
    self.level, self.prefix = level, prefix

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno <= self.level and record.getMessage().startswith(self.prefix))


def quiet_startup() -> None:
  """Filters STARTUP_NOISE from its loggers (once; before or after the libraries are imported)."""
  for name, level, prefix in STARTUP_NOISE:
    logger = logging.getLogger(name)
    if not any(isinstance(f, _DropStartupNoise) and f.prefix == prefix for f in logger.filters):
      logger.addFilter(_DropStartupNoise(level, prefix))


def run(main: Callable[[list[str]], None]) -> None:
  """app.run(main); the library's user errors (any `jaxspec.JaxspecError`: bad input, bad checkpoint, bad
  settings, caches too large for the devices, non-finite logits) end the script with one line on stderr and exit
  status 1. The first screen shows what the user asked for: `quiet_startup`'s lines are dropped."""
  quiet_startup()

  def wrapped(argv):
    try:
      main(argv)
    except JaxspecError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)
  app.run(wrapped, flags_parser=_parse)


def _parse(argv: list[str]) -> list[str]:
  """absl's parsing, with one line per error: ml_collections puts the traceback of a config file's get_config
  error into its message; the exception's own line is what names the problem."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    message = str(e).strip()
    if "Traceback (most recent call last)" in message:
      message = message.splitlines()[-1].strip()
    message = re.sub(r"invalid literal for int\(\) with base 10: ('.*'|\".*\")", r"expected an integer, got \1",
                     message)  # absl's integer flags pass on int()'s words
    message = re.sub(r"could not convert string to float: ('.*'|\".*\")", r"expected a number, got \1", message)
    print(f"FATAL Flags parsing error: {message}\nPass --helpshort or --helpfull to see help on flags.",
          file=sys.stderr)
    sys.exit(1)
