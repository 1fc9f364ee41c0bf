"""What runs only inside the compiled decoding program: the `lax.while_loop` (loop.py), verification of chains
(verify.py) and token trees (tree_verify.py), the sampling transforms both sides share (sampling.py) and the
draft-length schedules with their runtime knobs (adaptive.py).

Nothing here knows a drafter by kind: the loop reaches drafters through `drafters.protocol` only, and imports no
host API (engine, placement, arguments, memory_guard, settings); from the top level it reads only what it hands
back to the host (stats.py's `DecodeStats`, streaming.py's `emit`). tests/test_layers.py checks both.
"""
