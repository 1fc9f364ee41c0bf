"""jaxspec: exact speculative decoding (Leviathan, Kalman, Matias, ICML 2023) in JAX, for T5 and decoder-only LLMs.

The public core: `load` / `save`, `generate` (and `lower`: its programs), the settings it takes (`Sampling`,
`Speculation`, `Tree`), the errors it raises, the theory of Theorem
3.8, and meshes. `tune` (the tuner, jaxspec.bench) is loaded on first use: `import jaxspec` imports no training,
measurement or command-line code (docs/layers.md).
"""

from jaxspec.checkpoint import load, save
from jaxspec.decoding import (DecodeStats, GenerateOutput, LoweredCall, NGramDraft, Sampling, Speculation, TokenChunk,
                              Tree, best_gamma, expected_iterations, expected_speedup, expected_speedup_for_workload,
                              expected_tokens_per_iteration, generate, lower)
from jaxspec.errors import (CacheTooLargeError, CheckpointError, InputError, JaxspecError, NonFiniteLogitsError,
                            OutputError, SettingsError)
from jaxspec.model import FeatureHead, Model
from jaxspec.models.contract import Decoder, DecoderCache, ModelConfig
from jaxspec.models.t5 import T5Config
from jaxspec.sharding import (DEFAULT_RULES, DRAFT_RULES, initialize_distributed, is_main_process, make_mesh,
                              mesh_from_flag, shard)
from jaxspec.checkpoint.plan import memory_plan
from jaxspec.sharding.memory_plan import MemoryPlan
from jaxspec.version import __version__


def __getattr__(name: str):
  """`jaxspec.tune` on first use (the tuner imports the measurement layer)."""
  if name == "tune":
    from jaxspec.bench.tune import tune  # pylint: disable=import-outside-toplevel
    return tune
  raise AttributeError(f"module 'jaxspec' has no attribute {name!r}")


__all__ = ["__version__", "CacheTooLargeError", "CheckpointError", "DecodeStats", "Decoder", "DecoderCache",
           "FeatureHead", "GenerateOutput", "InputError", "JaxspecError", "LoweredCall", "Model", "ModelConfig", "NGramDraft",
           "NonFiniteLogitsError", "OutputError", "Sampling", "SettingsError", "Speculation", "T5Config", "TokenChunk",
           "Tree", "best_gamma",
           "expected_iterations", "expected_speedup", "expected_speedup_for_workload",
           "expected_tokens_per_iteration", "generate", "load", "lower", "save", "tune",
           # Scaling out (docs/scaling.md).
           "DEFAULT_RULES", "DRAFT_RULES", "MemoryPlan", "initialize_distributed", "is_main_process", "make_mesh",
           "memory_plan", "mesh_from_flag", "shard"]
