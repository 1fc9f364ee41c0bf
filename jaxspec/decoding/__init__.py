"""Plain and speculative decoding: `generate` and `lower` (engine.py), their settings (settings.py), the loop
(loop.py) and its drafters (drafter.py: the protocol; model_drafter.py, ngram.py, head_drafter.py), verification
(verify.py), token trees (tree.py: `Tree` and EAGLE-2's builder; tree_verify.py)."""

from jaxspec.decoding.engine import LoweredCall, generate, lower
from jaxspec.decoding.settings import NGramDraft, Sampling, Speculation
from jaxspec.decoding.stats import DecodeStats, GenerateOutput
from jaxspec.decoding.streaming import TokenChunk
from jaxspec.decoding.tree import Tree
from jaxspec.decoding.theory import (best_gamma, expected_iterations, expected_speedup,
                                     expected_speedup_for_workload, expected_tokens_per_iteration)

__all__ = ["DecodeStats", "GenerateOutput", "LoweredCall", "NGramDraft", "Sampling", "Speculation", "TokenChunk",
           "Tree",
           "best_gamma", "expected_iterations", "expected_speedup", "expected_speedup_for_workload",
           "expected_tokens_per_iteration", "generate", "lower"]
