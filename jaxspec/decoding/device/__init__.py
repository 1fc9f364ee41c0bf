"""What runs inside the compiled decoding program: the `lax.while_loop` (loop.py), verification of chains
(verify.py) and token trees (tree_verify.py), the sampling transforms both sides share (sampling.py), the
draft-length schedules with their runtime knobs (schedules.py), and the interfaces the loop owns: the `Drafter`
protocol it calls (drafter.py), the stats it counts (stats.py: `DecodeStats`, `GenerateOutput`) and the tokens it
streams to the host (streaming.py: `TokenChunk`, `emit`).

Nothing here knows a drafter by kind or imports drafters/ (every drafter imports drafter.py), and nothing imports
the host side of decoding (generation, placement, arguments, memory_guard, settings; type annotations aside): the host
API imports from here, never the other way. tests/test_layers.py checks both.
"""
