"""Everything that proposes tokens for the loop to verify, behind the `Drafter` protocol the loop owns
(device/drafter.py): one module per drafter kind (model_drafter.py, head_drafter.py, cross_head_drafter.py,
ngram.py, on the shared chain/tree base of chain.py and EAGLE-2's tree builder of tree.py), and the one
registration of kinds (registry.py: which `Speculation.draft` setting drafts with which drafter).

A new drafter kind is one module here plus one entry in `registry.KINDS` (docs/drafters.md). Drafters import the
loop's protocol and shared numerics (device/drafter.py, device/sampling.py, device/schedules.py) and the settings,
never the loop, the verifiers or the host API (generation, placement, memory_guard, arguments); tests/test_layers.py
checks it.
"""
