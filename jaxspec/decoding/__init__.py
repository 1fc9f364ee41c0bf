"""Plain and speculative decoding."""

from jaxspec.decoding.engine import DecodeStats, GenerateOutput, generate
from jaxspec.decoding.theory import (best_gamma, expected_iterations, expected_speedup,
                                     expected_speedup_for_workload, expected_tokens_per_iteration)

__all__ = ["DecodeStats", "GenerateOutput", "best_gamma", "expected_iterations", "expected_speedup",
           "expected_speedup_for_workload", "expected_tokens_per_iteration", "generate"]
