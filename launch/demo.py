r"""Runs plain and speculative decoding side by side on a random-weight T5 pair and prints what happened.

    python launch/demo.py
    python launch/demo.py --config.gamma=2 --config.temperature=1.0
"""

import os
import time

import jax
import numpy as np
from absl import logging

import jaxspec
from jaxspec.cli import flags as cli_flags
from jaxspec.bench import timing
from jaxspec.models import t5

CONFIG = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "demo.py"))
_CONFIG = cli_flags.define_config_file("config", CONFIG, "Demo settings.")


def random_model(name: str, vocab_size: int, shape: dict, seed: int) -> jaxspec.Model:
  cfg = t5.T5Config(vocab_size=vocab_size, activation="gelu_new", gated=True, tie_word_embeddings=False,
                    scale_decoder_outputs=False, **shape)
  return jaxspec.Model.random(cfg, seed, name=name)


def timed(fn, repeats: int):
  """(output, seconds of the first call with compilation, median seconds of `repeats` more)."""
  start = time.perf_counter()
  out = fn()
  first = time.perf_counter() - start
  return out, first, timing.median_time(fn, repeats, warmup=0)


def main(argv):
  del argv
  c = _CONFIG.value
  if c.temperature < 0 or not 0 < c.top_p <= 1 or c.gamma < 1 or c.batch_size < 1 or c.repeats < 1:
    raise SystemExit(f"config: need temperature >= 0, 0 < top_p <= 1, and gamma, batch_size, repeats >= 1; got {c}")
  logging.info("JAX devices: %s", jax.devices())
  target = random_model("target", c.vocab_size, c.target, c.seed)
  draft = random_model("draft", c.vocab_size, c.draft, c.seed + 1)
  rng = np.random.RandomState(c.seed)
  prompts = [list(rng.randint(2, c.vocab_size, size=c.prompt_length)) + [1] for _ in range(c.batch_size)]
  sampling = jaxspec.Sampling(temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
  kw = dict(max_new_tokens=c.max_new_tokens, seed=c.seed)
  plain, plain_first, plain_t = timed(lambda: jaxspec.generate(target, prompts, None, sampling, **kw), c.repeats)
  speculation = jaxspec.Speculation(draft, gamma=c.gamma)
  spec, spec_first, spec_t = timed(lambda: jaxspec.generate(target, prompts, speculation, sampling, **kw), c.repeats)
  s = spec.stats
  print(f"target: {target}\ndraft:  {draft}")
  print(f"batch {c.batch_size}, gamma {c.gamma}, temperature {c.temperature}, max_new_tokens {c.max_new_tokens}")
  for i in range(min(2, c.batch_size)):
    print(f"row {i}: {spec.tokens[i, :spec.lengths[i]].tolist()}")
  print(f"alpha {s.alpha:.3f}   accepted/drafted {s.acceptance_rate:.3f}   "
        f"tokens per iteration {s.tokens_per_iteration:.2f} (bonus token included)")
  print("acceptance per draft position: " + " ".join(f"{a:.2f}" for a in s.acceptance_per_position))
  per_tok = lambda t, out: 1e3 * t / max(out.lengths.sum(), 1)
  print(f"plain:       {per_tok(plain_t, plain):7.3f} ms/token (first call with compilation {plain_first:.1f} s)")
  print(f"speculative: {per_tok(spec_t, spec):7.3f} ms/token (first call with compilation {spec_first:.1f} s)")
  print(f"speedup {plain_t / spec_t * spec.lengths.sum() / plain.lengths.sum():.2f}x (median of {c.repeats})")
  if c.temperature == 0:
    same = np.array_equal(plain.tokens, spec.tokens)
    print(f"greedy outputs identical: {same}")
    if not same:
      raise SystemExit("speculative output differs from plain greedy output")


if __name__ == "__main__":
  cli_flags.run(main)
