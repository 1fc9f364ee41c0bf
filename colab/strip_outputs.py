"""Strips outputs from the Colab notebooks before they are committed, or checks that they hold none.

    python colab/strip_outputs.py colab/*.ipynb            # strip in place
    python colab/strip_outputs.py --check colab/*.ipynb    # exit 1 naming each notebook that holds outputs

Stripped means: no code cell has outputs or an execution count, and no run-specific metadata remains (Colab's
per-cell execution records, widget state). Cell sources, tags (the `parameters` cell) and notebook metadata that
picks the runtime (`accelerator`) are kept.
"""

from __future__ import annotations

import argparse
import json
import sys

RUN_CELL_METADATA = ("execution", "outputId", "colab", "executionInfo", "scrolled", "collapsed")
RUN_NOTEBOOK_METADATA = ("widgets",)


def problems(nb: dict) -> list[str]:
  """What makes a notebook (its JSON as a dict) not stripped: one message per offending cell or field."""
  out = [f"notebook metadata {key!r}" for key in RUN_NOTEBOOK_METADATA if key in nb.get("metadata", {})]
  for i, cell in enumerate(nb.get("cells", [])):
    if cell.get("cell_type") != "code":
      continue
    if cell.get("outputs"):
      out.append(f"cell {i}: {len(cell['outputs'])} outputs")
    if cell.get("execution_count") is not None:
      out.append(f"cell {i}: execution_count {cell['execution_count']}")
    out += [f"cell {i}: metadata {key!r}" for key in RUN_CELL_METADATA if key in cell.get("metadata", {})]
  return out


def strip(nb: dict) -> dict:
  """The notebook with outputs, execution counts and run-specific metadata removed (in place; returned)."""
  for key in RUN_NOTEBOOK_METADATA:
    nb.get("metadata", {}).pop(key, None)
  for cell in nb.get("cells", []):
    if cell.get("cell_type") == "code":
      cell["outputs"] = []
      cell["execution_count"] = None
    for key in RUN_CELL_METADATA:
      cell.get("metadata", {}).pop(key, None)
  return nb


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--check", action="store_true", help="only report notebooks that hold outputs")
  parser.add_argument("paths", nargs="+")
  args = parser.parse_args(argv)
  bad = 0
  for path in args.paths:
    with open(path, encoding="utf-8") as f:
      nb = json.load(f)
    found = problems(nb)
    if args.check:
      if found:
        bad += 1
        print(f"{path}: not stripped: " + "; ".join(found))
      continue
    if found:
      with open(path, "w", encoding="utf-8") as f:
        json.dump(strip(nb), f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
      print(f"{path}: stripped ({len(found)} items)")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
