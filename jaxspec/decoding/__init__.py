"""Plain and speculative decoding."""

from jaxspec.decoding.engine import generate
from jaxspec.decoding.ngram import NGramDraft
from jaxspec.decoding.stats import DecodeStats, GenerateOutput
from jaxspec.decoding.streaming import TokenChunk
from jaxspec.decoding.theory import (best_gamma, expected_iterations, expected_speedup,
                                     expected_speedup_for_workload, expected_tokens_per_iteration)

__all__ = ["DecodeStats", "GenerateOutput", "NGramDraft", "TokenChunk", "best_gamma", "expected_iterations",
           "expected_speedup", "expected_speedup_for_workload", "expected_tokens_per_iteration", "generate"]
