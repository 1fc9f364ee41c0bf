"""The package's layers (docs/layers.md): `import jaxspec` loads the public core only."""

import subprocess
import sys

HEAVY = ("optax", "ml_collections", "matplotlib", "sacrebleu", "torch", "tqdm")
UPPER_LAYERS = ("jaxspec.cli", "jaxspec.bench", "jaxspec.training", "jaxspec.data")


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
