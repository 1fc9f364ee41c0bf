"""The package's layers (docs/layers.md): `import jaxspec` loads the public core only."""

import subprocess
import sys

HEAVY = ("optax", "ml_collections", "matplotlib", "sacrebleu", "torch", "tqdm")
UPPER_LAYERS = ("jaxspec.cli", "jaxspec.bench", "jaxspec.training", "jaxspec.data", "jaxspec.serving", "jaxspec.tools")


def _modules_after(statement: str) -> set[str]:
  code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
  return set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split())


def test_import_jaxspec_loads_no_training_measurement_or_cli_code():
  loaded = _modules_after("import jaxspec")
  assert not [m for m in HEAVY if m in loaded]
  assert not [m for m in loaded if m.startswith(UPPER_LAYERS)]


def test_the_tuner_loads_on_first_use():
  loaded = _modules_after("import jaxspec; jaxspec.tune")
  assert "jaxspec.bench.tune" in loaded  # the check above can fail: this is what it would see


# --- the import graph ---------------------------------------------------------------------------------------------

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jaxspec"
# docs/layers.md: each layer imports only the layers below it (a layer may import itself; two packages of one layer
# import neither each other, except the upper layer's bench, training and data, which may).
LAYER = {"models": 0, "sharding": 1, "checkpoint": 2, "decoding": 2, "core": 3, "serving": 4, "tools": 4,
         "bench": 5, "training": 5, "data": 5, "cli": 6}
SIDEWAYS_OK = 5  # the one layer whose packages may import each other


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_PACKAGES = {_module(p) + "." for p in ROOT.rglob("*.py")}  # "jaxspec.decoding.device.loop." etc.


def _imports(top_level_only: bool) -> dict[str, set[str]]:
  """{module: jaxspec modules it imports} (every `import` / `from ... import` statement, or only those run at
  import time: not inside a function)."""
  graph = {}
  for path in ROOT.rglob("*.py"):
    tree, name = ast.parse(path.read_text()), _module(path)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # also `if TYPE_CHECKING:` blocks stay out: they never run
      nodes = [n for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))]
    found = set()
    for node in nodes:
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxspec"):
        found.update(_imported(node))
      elif isinstance(node, ast.Import):
        found.update(a.name for a in node.names if a.name.startswith("jaxspec"))
    graph[name] = found
  return graph


def _imported(node: ast.ImportFrom) -> set[str]:
  """The modules `from M import a, b` imports: M.a where that is a module (`from pkg import module`), else M."""
  return {node.module + "." + a.name if node.module + "." + a.name + "." in _PACKAGES else node.module
          for a in node.names}


def _layer(module: str) -> str:
  if module in ("jaxspec.errors", "jaxspec.version", "jaxspec.checks"):
    return "base"  # the one error base, the version and the integer / seed checks: below everything
  parts = module.split(".")
  return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYER) else "core"


def test_the_import_graph_has_no_cycle():
  """No module imports itself back through others, counting every import: at import time, inside functions and
  under `if TYPE_CHECKING:` (a deferred import is still a circle in the design; modules of one package read as that
  package's `__init__` importing them is not a cycle: only module-to-module arrows count). settings.py is a leaf of
  decoding: the registry, not `Speculation`, checks a draft's kind."""
  graph = _imports(False)
  state = {}

  def visit(m, stack):
    state[m] = 1
    for t in graph.get(m, ()):
      if t == m or m.startswith(t + ".") or t.startswith(m + "."):
        continue  # a package and its own modules
      if state.get(t) == 1:
        raise AssertionError("import cycle: " + " -> ".join(stack + [t]))
      if t not in state:
        visit(t, stack + [t])
    state[m] = 2

  for m in sorted(graph):
    if m not in state:
      visit(m, [m])


def test_no_arrow_against_the_layers():
  """Every import (function-level ones too, and `if TYPE_CHECKING:` ones) goes down a layer or stays in its package
  (docs/layers.md): bench, training and data import each other, the shared helpers (tools) and the core, never
  the command line (cli, the top: no bench <-> cli circle, no data -> cli). `import jaxspec`'s lazy `tune`
  (core -> bench) is the documented exception."""
  arrows = set()
  for m, targets in _imports(False).items():
    for t in targets:
      a, b = _layer(m), _layer(t)
      if a == b or b == "base" or (m, t) == ("jaxspec", "jaxspec.bench.tune"):
        continue
      if LAYER[b] > LAYER[a] or LAYER[a] == LAYER[b] != SIDEWAYS_OK:
        arrows.add((a, b, m, t))  # up, or sideways where the table does not allow it
  assert not arrows, sorted(arrows)


# --- inside decoding: the host API, device/ and drafters/ (docs/layers.md) --------------------------------------------

D = "jaxspec.decoding."
# What each part of decoding may import from decoding at run time (type annotations under TYPE_CHECKING aside).
DECODING_MAY_IMPORT = {
    # The compiled program: owns the interfaces it calls and hands back (the Drafter protocol, the stats it counts,
    # the streamed chunks: device/drafter.py, stats.py, streaming.py) and imports nothing of drafters/ or of the host
    # side (the host API imports device/, never the other way).
    D + "device": (D + "device",),
    # Drafters: the protocol they implement, the loop's shared numerics and the settings they are made from, never
    # the loop, the verifiers or the host API (generation, placement, memory_guard, arguments).
    D + "drafters": (D + "drafters", D + "device.drafter", D + "device.sampling", D + "device.schedules",
                     D + "settings"),
}



def _runtime_imports() -> dict[str, set[str]]:
  """{module: jaxspec modules it imports}, every import statement but those under `if TYPE_CHECKING:`."""
  graph = {}
  for path in ROOT.rglob("*.py"):
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and getattr(node.test, "id", None) ==
            "TYPE_CHECKING" for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
      if id(node) in skip:
        continue
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxspec"):
        found.update(_imported(node))
      elif isinstance(node, ast.Import):
        found.update(a.name for a in node.names if a.name.startswith("jaxspec"))
    graph[_module(path)] = found
  return graph



def test_the_loop_knows_no_drafter_and_drafters_no_loop():
  """device/ imports nothing of decoding but device/ (the Drafter protocol, the stats and the streaming are
  device/'s own); drafters/ imports of device/ only the protocol and the shared numerics, never the loop, the
  verifiers or the host API (so a new drafter kind touches drafters/ only)."""
  bad = []
  for m, targets in _runtime_imports().items():
    part = next((p for p in DECODING_MAY_IMPORT if m == p or m.startswith(p + ".")), None)
    if part is None:
      continue
    for t in targets:
      if t.startswith(D) and not any(t == ok or t.startswith(ok + ".") for ok in DECODING_MAY_IMPORT[part]):
        bad.append((m, t))
  assert not bad, sorted(bad)


def test_the_loop_imports_no_drafter_even_for_annotations():
  """device/ imports nothing of drafters/ at all: not inside functions, not under `if TYPE_CHECKING:` (the loop
  owns the protocol its drafters implement, so the arrow runs one way)."""
  bad = sorted((m, t) for m, targets in _imports(False).items() if m.startswith(D + "device")
               for t in targets if t.startswith(D + "drafters"))
  assert not bad, bad


def test_serving_knows_drafters_only_through_the_registry():
  """jaxspec.serving imports of decoding/drafters/ only the registry (every import counted, function-level and
  `if TYPE_CHECKING:` ones too): the slot engine gets its drafter, a draft model wrapped for serving included
  (drafters/served_draft.py), from `registry`, never by naming a drafter class."""
  bad = sorted((m, t) for m, targets in _imports(False).items() if m.startswith("jaxspec.serving")
               for t in targets if t.startswith(D + "drafters") and t != D + "drafters.registry")
  assert not bad, bad
