"""What runs only inside the compiled decoding program: the `lax.while_loop` (loop.py), verification of chains
(verify.py) and token trees (tree_verify.py), the sampling transforms both sides share (sampling.py) and the
draft-length schedules with their runtime knobs (adaptive.py).

It also holds the `Drafter` protocol the loop calls (drafter.py): nothing here knows a drafter by kind or imports
drafters/ (every drafter imports drafter.py), and nothing imports the
host API (engine, placement, arguments, memory_guard, settings); from the top level it reads only what it hands
back to the host (stats.py's `DecodeStats`, streaming.py's `emit`). tests/test_layers.py checks both.
"""
