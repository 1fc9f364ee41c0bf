"""The command-line layer under launch/: shared absl flags, jobs (text in, text out, calibration with the tuner),
resumable outputs. The helpers it shares with bench, training and data (inputs, batching, outputs) are
`jaxspec.tools`.

Nothing in the library imports this package; launch scripts and notebooks do.
"""
