"""The command-line layer under launch/: shared absl flags, jobs, batching over `generate`, input and output files.

Nothing in the decoding library imports this package; launch scripts and notebooks do.
"""
