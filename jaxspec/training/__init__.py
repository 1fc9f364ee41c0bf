"""Training T5 pairs (steps.py: losses, optimizer, resumable state) and the EN-DE training loop (loop.py).

Loaded only when used: `import jaxspec` imports neither optax nor this package.
"""
