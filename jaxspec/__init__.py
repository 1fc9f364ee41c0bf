"""jaxspec: exact speculative decoding (Leviathan, Kalman, Matias, ICML 2023) for T5 in JAX."""

from jaxspec.checkpoint import CheckpointError, load, save
from jaxspec.decoding import (DecodeStats, GenerateOutput, best_gamma, expected_iterations, expected_speedup,
                              expected_speedup_for_workload, expected_tokens_per_iteration, generate)
from jaxspec.model import Model
from jaxspec.models.t5 import T5Config

__all__ = ["CheckpointError", "DecodeStats", "GenerateOutput", "Model", "T5Config", "best_gamma",
           "expected_iterations", "expected_speedup", "expected_speedup_for_workload",
           "expected_tokens_per_iteration", "generate", "load", "save"]
