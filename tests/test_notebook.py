"""The Colab notebooks (colab/*.ipynb): each runs top to bottom on CPU in small mode, and is committed stripped.

Each notebook is executed by nbclient in a kernel of this interpreter (a kernelspec written to a temporary
directory whose argv is `sys.executable`, so the venv's python runs it whatever kernels the user has installed),
with `SMALL = True` injected after its `parameters` cell as papermill injects parameters, JAXSPEC_NOTEBOOK_SMALL=1
in the kernel's environment, JAX on CPU and the Hugging Face Hub offline. Any cell error fails the test with that
cell's traceback; the notebooks' own asserts (speculative output == plain output, ...) run as part of it.
"""

import glob
import importlib.util
import json
import os
import sys

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from script_helpers import compile_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "colab", "*.ipynb")))
KERNEL = "jaxspec-test-venv"
CELL_TIMEOUT_S = 900
KERNEL_ENV = {"JAXSPEC_NOTEBOOK_SMALL": "1", "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
              "TRANSFORMERS_OFFLINE": "1"}


def _name(path: str) -> str:
  return os.path.splitext(os.path.basename(path))[0]


def _strip_outputs():
  spec = importlib.util.spec_from_file_location("strip_outputs", os.path.join(ROOT, "colab", "strip_outputs.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _code_cells(nb) -> list:
  return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _source(cell) -> str:
  return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def test_the_three_notebooks_exist():
  assert {"quickstart", "paper", "your_model"} <= {_name(p) for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_name)
def test_committed_without_outputs(path):
  with open(path, encoding="utf-8") as f:
    nb = json.load(f)
  assert _strip_outputs().problems(nb) == [], f"{path}: run python colab/strip_outputs.py {path}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_name)
def test_opens_with_an_install_cell_and_a_parameters_cell(path):
  nb = nbformat.read(path, as_version=4)
  cells = _code_cells(nb)
  install = _source(cells[0])
  assert "JAXSPEC_SOURCE = " in install and '%pip install -q "jaxspec[bench] @ {JAXSPEC_SOURCE}"' in install
  assert "google.colab" in install
  assert not any(("pip install" in _source(c) and "-e " in _source(c)) or "!pip" in _source(c) for c in cells)
  params = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
  assert len(params) == 1 and "SMALL = False" in _source(params[0])


def _kernel(tmp_path) -> KernelManager:
  """A kernel manager that starts this interpreter's ipykernel with the small-mode environment."""
  directory = tmp_path / "kernels" / KERNEL
  directory.mkdir(parents=True)
  env = dict(KERNEL_ENV, **compile_env(),  # compiled as the launch scripts under test are
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
          "display_name": "jaxspec tests", "language": "python", "env": env}
  (directory / "kernel.json").write_text(json.dumps(spec))
  return KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(directory.parent)]))


def _inject_small(nb) -> None:
  """SMALL = True in a cell right after the `parameters` cell (papermill's convention)."""
  index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
  nb.cells.insert(index + 1, nbformat.v4.new_code_cell("SMALL = True", metadata={"tags": ["injected-parameters"]}))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_name)
def test_runs_top_to_bottom_in_small_mode_on_cpu(path, tmp_path):
  nb = nbformat.read(path, as_version=4)
  _inject_small(nb)
  work = tmp_path / "work"
  work.mkdir()
  client = NotebookClient(nb, km=_kernel(tmp_path), timeout=CELL_TIMEOUT_S, allow_errors=False,
                          resources={"metadata": {"path": str(work)}})
  client.execute()  # raises CellExecutionError (with the traceback) on the first failing cell
  outputs = [o for c in _code_cells(nb) for o in c.outputs]
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "SMALL = True" in text  # the runtime cell saw small mode
  assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was displayed"
  assert not [o for o in outputs if o.output_type == "error"]
