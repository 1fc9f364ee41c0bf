"""jaxspec: exact speculative decoding (Leviathan, Kalman, Matias, ICML 2023) in JAX, for T5 and decoder-only LLMs."""

from jaxspec.checkpoint import CheckpointError, load, save
from jaxspec.decoding import (CacheTooLargeError, DecodeStats, GenerateOutput, NGramDraft, NonFiniteLogitsError,
                              TokenChunk, best_gamma, expected_iterations, expected_speedup,
                              expected_speedup_for_workload, expected_tokens_per_iteration, generate)
from jaxspec.model import Model
from jaxspec.models.contract import Decoder, DecoderCache, ModelConfig
from jaxspec.models.t5 import T5Config
from jaxspec.memory_plan import MemoryPlan, memory_plan
from jaxspec.sharding import (DEFAULT_RULES, DRAFT_RULES, initialize_distributed, is_main_process, make_mesh,
                              mesh_from_flag, shard)
from jaxspec.version import __version__
from jaxspec.bench.tune import tune  # noqa: E402  (after the names it uses)

__all__ = ["__version__", "CacheTooLargeError", "CheckpointError", "DecodeStats", "Decoder", "DecoderCache", "GenerateOutput",
           "Model", "ModelConfig", "NGramDraft", "NonFiniteLogitsError", "T5Config", "TokenChunk", "best_gamma",
           "expected_iterations", "expected_speedup", "expected_speedup_for_workload",
           "expected_tokens_per_iteration", "generate", "load", "save", "tune",
           # Scaling out (docs/scaling.md).
           "DEFAULT_RULES", "DRAFT_RULES", "MemoryPlan", "initialize_distributed", "is_main_process", "make_mesh",
           "memory_plan", "mesh_from_flag", "shard"]
