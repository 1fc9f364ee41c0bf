"""Training: T5 pairs (steps.py: losses, optimizer, resumable state; loop.py: the EN-DE training loop; ende_pair.py:
the v2 pair's stages, target, distillation, draft, packing, under one clock) and EAGLE-3
feature heads (head_data.py: regenerated responses, the draft vocabulary, the target's features per batch;
head_steps.py: the training-time test's loss and the train step; head.py: `train_head`, resumable, on a mesh).

Loaded only when used: `import jaxspec` imports neither optax nor this package.
"""
