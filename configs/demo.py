"""Settings of launch/demo.py: a random-weight T5 pair that shows the engine end to end in a minute on CPU.

The weights are random, so the draft rarely agrees with the target: this demonstrates exactness and the stats,
not a speedup (a trained pair is what makes speculation pay).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.vocab_size = 512  # Shared by target and draft.
  c.target = dict(d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_decoder_layers=4, num_heads=8)  # Its shape.
  c.draft = dict(d_model=64, d_kv=16, d_ff=256, num_layers=1, num_decoder_layers=1, num_heads=4)  # Its shape.
  c.batch_size = 4  # Prompts per generate call.
  c.prompt_length = 12  # Random prompt tokens per row.
  c.gamma = 4  # Draft tokens per iteration.
  c.max_new_tokens = 32  # Tokens generated per row at most.
  c.temperature = 0.0  # 0 = greedy (exactly the target's greedy output).
  c.top_k = 0  # Top-k sampling (0 = off).
  c.top_p = 1.0  # Nucleus sampling mass (1 = off).
  c.repeats = 3  # Timed calls after the warm-up call; the median is reported.
  c.seed = 0  # Weights, prompts and sampling.
  return c
