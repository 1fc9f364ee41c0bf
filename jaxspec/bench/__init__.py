"""Benchmarks of plain vs speculative decoding: sweeps (`sweep`, `peer`, `hardware`, `loop`, `trees`), their inputs
(`inputs`: the prompts the benchmark scripts share) and reports (`report`: JSON, aligned markdown tables, plots,
the speed summary of translate.py and generate.py), and the paper-shaped GPU measurement: `oracle` (a draft with a
real draft's cost and a chosen acceptance rate) and `paper_speedups` (Table 2's rows with it)."""
