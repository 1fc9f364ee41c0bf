"""The paper's Table 2 (Leviathan et al. 2023).

Table 2: T5-XXL (11B) target, batch 1, one TPU-v4; for each task, draft and temperature the paper's best gamma,
its measured alpha and speedup, the draft's cost ratio c, and `exp`: Theorem 3.8's expected speedup with that
alpha, gamma and c, rounded as the paper prints it (tests/bench/test_presets.py recomputes it).
"""

from __future__ import annotations

import dataclasses



@dataclasses.dataclass(frozen=True)
class PaperRow:
  """One row of the paper's Table 2."""

  task: str  # "ende" (WMT EnDe) or "cnndm" (CNN/DM summarisation).
  draft: str  # "small", "base" or "large": the T5 1.0 draft.
  temperature: int  # 0 (greedy) or 1.
  gamma: int  # The paper's best gamma.
  alpha: float  # Measured acceptance rate.
  speedup: float  # Measured wall-time speedup.
  c: float  # The draft's cost relative to the target's.
  exp: float  # Theorem 3.8 with alpha, gamma and c, as printed (one decimal).

  @property
  def name(self) -> str:
    return f"{self.task}_{self.draft}_t{self.temperature}"


TABLE2 = [PaperRow(*row) for row in (
    ("ende", "small", 0, 7, 0.75, 3.4, 0.02, 3.2), ("ende", "base", 0, 7, 0.80, 2.8, 0.04, 3.3),
    ("ende", "large", 0, 7, 0.82, 1.7, 0.11, 2.5), ("ende", "small", 1, 7, 0.62, 2.6, 0.02, 2.3),
    ("ende", "base", 1, 5, 0.68, 2.4, 0.04, 2.4), ("ende", "large", 1, 3, 0.71, 1.4, 0.11, 2.0),
    ("cnndm", "small", 0, 5, 0.65, 3.1, 0.02, 2.4), ("cnndm", "base", 0, 5, 0.73, 3.0, 0.04, 2.6),
    ("cnndm", "large", 0, 3, 0.74, 2.2, 0.11, 2.0), ("cnndm", "small", 1, 5, 0.53, 2.3, 0.02, 1.9),
    ("cnndm", "base", 1, 3, 0.55, 2.2, 0.04, 1.8), ("cnndm", "large", 1, 3, 0.56, 1.7, 0.11, 1.6),
)]
TASK_PREFIX = {"ende": "translate English to German: ", "cnndm": "summarize: "}
TASK_INPUT = {"ende": "newstest2014.en", "cnndm": "cnndm_test.source"}  # One input a line.
TASK_MAX_NEW_TOKENS = {"ende": 128, "cnndm": 256}


def paper_row(name: str) -> PaperRow:
  """The row named '{task}_{draft}_t{temperature}', e.g. 'ende_small_t0'."""
  rows = {r.name: r for r in TABLE2}
  if name not in rows:
    raise ValueError(f"unknown Table 2 row {name!r}; rows: {', '.join(rows)}.")
  return rows[name]


def paper_row_for(task: str, draft_shape: str, temperature: int) -> PaperRow | None:
  """The row of a draft shape ('t5-small', ...) for a task and temperature, or None (e.g. for t5-3b)."""
  name = f"{task}_{draft_shape.removeprefix('t5-')}_t{temperature}"
  return next((r for r in TABLE2 if r.name == name), None)
