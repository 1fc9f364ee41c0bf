"""The Colab quickstart's code cells run (shell cells such as `!pip install` are skipped)."""

import json
import os

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "colab", "quickstart.ipynb")


def test_quickstart_notebook_runs():
  with open(NOTEBOOK) as f:
    nb = json.load(f)
  code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
  namespace = {}
  exec(compile("\n".join(c for c in code if not c.lstrip().startswith("!")), NOTEBOOK, "exec"), namespace)
  assert namespace["spec"].stats.tokens_per_iteration >= 1.0
