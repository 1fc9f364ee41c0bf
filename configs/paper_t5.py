"""The paper's T5 setups (Leviathan et al. 2023, Table 2): `--paper=configs/paper_t5.py:ende_small_t0` etc.

Row names: {ende,cnndm}_{small,base,large}_t{0,1} (`jaxspec.bench.presets.TABLE2`, where the paper's numbers live).
Each gives the public checkpoints (T5-11B target, T5-small / base / large draft: the original T5 1.0 models,
trained on a mixture that includes WMT En-De and CNN/DM), the task prefix, the paper's gamma and temperature, and
the paper's measured alpha and speedup for comparison. `checkpoint_dir` (required) is where the downloaded
Hugging Face directories live (t5-11b/, t5-small/, ...).
Run: python launch/benchmark.py --paper=configs/paper_t5.py:ende_small_t0 --paper.checkpoint_dir=DIR
(docs/benchmarks.md).
"""

import ml_collections
from ml_collections import config_dict

from jaxspec.bench import presets


def get_config(row: str = "ende_small_t0") -> ml_collections.ConfigDict:
  paper = presets.paper_row(row)
  cfg = ml_collections.ConfigDict()
  cfg.checkpoint_dir = config_dict.placeholder(str)  # Required: the directory holding t5-11b/, t5-small/, ...
  cfg.target = "t5-11b"  # Target checkpoint directory name under checkpoint_dir.
  cfg.draft = f"t5-{paper.draft}"  # Draft checkpoint directory name under checkpoint_dir.
  cfg.prefix = presets.TASK_PREFIX[paper.task]  # T5's task prefix, put before every input.
  cfg.input = presets.TASK_INPUT[paper.task]  # Inputs, one a line (relative to the working directory).
  cfg.gamma = paper.gamma  # The paper's best gamma for this row.
  cfg.temperature = float(paper.temperature)  # 0 = greedy, 1 = sampling.
  cfg.batch_size = 1  # The paper measured batch 1 on one TPU-v4.
  cfg.max_new_tokens = presets.TASK_MAX_NEW_TOKENS[paper.task]  # Tokens generated per input at most.
  cfg.paper_alpha = paper.alpha  # The paper's measured alpha (for comparison).
  cfg.paper_speedup = paper.speedup  # The paper's measured speedup (for comparison).
  cfg.paper_c = paper.c  # The paper's draft cost ratio c.
  return cfg
