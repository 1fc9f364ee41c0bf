"""Plain and speculative decoding, in three parts (docs/layers.md):

  - here, the host API: `generate` and `lower` (generation.py), their settings (settings.py: `Sampling`,
    `Speculation`, `Tree`, `NGramDraft`), argument checks (arguments.py), placement and compilation
    (placement.py), the memory check (memory_guard.py) and Theorem 3.8's best gamma (theory.py);
  - device/: what runs inside the compiled program: the loop, the `Drafter` protocol it calls, verification,
    sampling transforms, schedules, and what the loop hands back to the host (stats.py's `DecodeStats` and
    `GenerateOutput`, streaming.py's `TokenChunk`);
  - drafters/: one module per drafter kind, and their one registration (registry.py).
"""

from jaxspec.decoding.device.stats import DecodeStats, GenerateOutput
from jaxspec.decoding.device.streaming import TokenChunk
from jaxspec.decoding.generation import LoweredCall, generate, lower
from jaxspec.decoding.settings import NGramDraft, Sampling, Speculation, Tree
from jaxspec.decoding.theory import (best_gamma, expected_iterations, expected_speedup,
                                     expected_speedup_for_workload, expected_tokens_per_iteration)

__all__ = ["DecodeStats", "GenerateOutput", "LoweredCall", "NGramDraft", "Sampling", "Speculation", "TokenChunk",
           "Tree",
           "best_gamma", "expected_iterations", "expected_speedup", "expected_speedup_for_workload",
           "expected_tokens_per_iteration", "generate", "lower"]
