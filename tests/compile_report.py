"""Where the in-process tests' seconds go: XLA compiles, tracing, lowering and compilation-cache hits per file.

    PYTHONPATH=tests JAXSPEC_COMPILE_REPORT=/tmp/report .venv/bin/python -m pytest -q -p compile_report
    .venv/bin/python tests/compile_report.py /tmp/report        # the table, slowest files first

As a pytest plugin (`-p compile_report`) it listens to JAX's monitoring events from each worker's first test on
(JAX is imported then, after conftest.py has set the compilation cache's variables) and writes, per worker,
{test id: {event: seconds or count}} to $JAXSPEC_COMPILE_REPORT/<worker>.json; a module fixture's work counts
against the first test that asks for it. Run as a script, it sums a report's workers per file. JAX subprocesses
(launch scripts, sharding workers, notebook kernels) are not counted: their files show wall seconds only.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys

DIRECTORY = "JAXSPEC_COMPILE_REPORT"
COLUMNS = {  # column -> JAX monitoring event ("n:" counts events, otherwise their seconds are summed)
    "compile s": "/jax/core/compile/backend_compile_duration",
    "trace s": "/jax/core/compile/jaxpr_trace_duration",
    "lower s": "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "cache hits": "n:/jax/compilation_cache/cache_hits",
    "cache misses": "n:/jax/compilation_cache/cache_misses",
}

_events: dict = collections.defaultdict(lambda: collections.defaultdict(float))
_current = {"test": None, "listening": False}


def _listen() -> None:
  import jax.monitoring  # pylint: disable=import-outside-toplevel

  def duration(event: str, seconds: float, **_) -> None:
    if _current["test"] is not None:
      _events[_current["test"]][event] += seconds

  def count(event: str, **_) -> None:
    if _current["test"] is not None:
      _events[_current["test"]]["n:" + event] += 1

  jax.monitoring.register_event_duration_secs_listener(duration)
  jax.monitoring.register_event_listener(count)
  _current["listening"] = True


def pytest_runtest_setup(item) -> None:
  if not _current["listening"]:
    _listen()
  _current["test"] = item.nodeid


def pytest_runtest_logreport(report) -> None:
  _events[report.nodeid]["wall"] += report.duration


def pytest_sessionfinish(session) -> None:
  del session
  directory = os.environ.get(DIRECTORY)
  if not directory:
    return
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, os.environ.get("PYTEST_XDIST_WORKER", "main") + ".json"), "w",
            encoding="utf-8") as f:
    json.dump(_events, f)


def table(directory: str) -> str:
  """The report's files, slowest first, as a markdown table (and a total row)."""
  files: dict = collections.defaultdict(collections.Counter)
  for path in glob.glob(os.path.join(directory, "*.json")):
    with open(path, encoding="utf-8") as f:
      for test, events in json.load(f).items():
        files[test.split("::", 1)[0]].update(events)
  header = ["file", "wall s", *COLUMNS]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  total: collections.Counter = collections.Counter()
  for name, events in sorted(files.items(), key=lambda kv: -kv[1]["wall"]):
    total.update(events)
    lines.append(f"| {name} | {events['wall']:.0f} | " + " | ".join(f"{events[e]:.0f}" for e in COLUMNS.values())
                 + " |")
  lines.append(f"| total | {total['wall']:.0f} | " + " | ".join(f"{total[e]:.0f}" for e in COLUMNS.values()) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
    sys.exit(f"usage: python {sys.argv[0]} REPORT_DIRECTORY (the ${DIRECTORY} of a run)")
  print(table(sys.argv[1]))
