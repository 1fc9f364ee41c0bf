"""The paper's T5 setups (Leviathan et al. 2023, Table 2): `--config=configs/paper_t5.py:ende_small_t0` etc.

Row names: {ende,cnndm}_{small,base,large}_t{0,1}. Each gives the public checkpoints (T5-11B target, T5-small /
base / large draft: the original T5 1.0 models, trained on a mixture that includes WMT En-De and CNN/DM), the
task prefix, the paper's gamma and temperature, and the paper's measured alpha and speedup for comparison.
`checkpoint_dir` is where the downloaded Hugging Face directories live (t5-11b/, t5-small/, ...).
Run: python launch/benchmark.py --paper=configs/paper_t5.py:ende_small_t0 --paper.checkpoint_dir=DIR
(docs/benchmarks.md).
"""

import ml_collections

# (task, draft, temperature) -> (gamma, alpha, speedup, c) from the paper's Table 2.
TABLE2 = {
    ("ende", "small", 0): (7, 0.75, 3.4, 0.02), ("ende", "base", 0): (7, 0.80, 2.8, 0.04),
    ("ende", "large", 0): (7, 0.82, 1.7, 0.11), ("ende", "small", 1): (7, 0.62, 2.6, 0.02),
    ("ende", "base", 1): (5, 0.68, 2.4, 0.04), ("ende", "large", 1): (3, 0.71, 1.4, 0.11),
    ("cnndm", "small", 0): (5, 0.65, 3.1, 0.02), ("cnndm", "base", 0): (5, 0.73, 3.0, 0.04),
    ("cnndm", "large", 0): (3, 0.74, 2.2, 0.11), ("cnndm", "small", 1): (5, 0.53, 2.3, 0.02),
    ("cnndm", "base", 1): (3, 0.55, 2.2, 0.04), ("cnndm", "large", 1): (3, 0.56, 1.7, 0.11),
}
PREFIX = {"ende": "translate English to German: ", "cnndm": "summarize: "}


def get_config(row: str = "ende_small_t0") -> ml_collections.ConfigDict:
  task, draft, temp = row.split("_")
  key = (task, draft, int(temp.lstrip("t")))
  if key not in TABLE2:
    raise ValueError(f"unknown row {row!r}; rows: " + ", ".join(f"{t}_{d}_t{T}" for t, d, T in TABLE2))
  gamma, alpha, speedup, c = TABLE2[key]
  cfg = ml_collections.ConfigDict()
  cfg.checkpoint_dir = "/mnt/disks/t5"  # Directory holding t5-11b/, t5-small/, t5-base/, t5-large/.
  cfg.target = "t5-11b"
  cfg.draft = f"t5-{draft}"
  cfg.prefix = PREFIX[task]
  cfg.input = "newstest2014.en" if task == "ende" else "cnndm_test.source"  # One input a line.
  cfg.gamma = gamma
  cfg.temperature = float(key[2])
  cfg.batch_size = 1  # The paper measured batch 1 on one TPU-v4.
  cfg.max_new_tokens = 128 if task == "ende" else 256
  cfg.paper_alpha = alpha
  cfg.paper_speedup = speedup
  cfg.paper_c = c
  return cfg
