"""The embedded EN-DE pair: loadable by name, small, sharing one tokenizer, and exact together."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.checkpoint import embedded_names

EMBEDDED = os.path.join(os.path.dirname(jaxspec.__file__), "embedded")


@pytest.fixture(scope="module")
def pair():
  return jaxspec.load("ende-target"), jaxspec.load("ende-draft")


def test_pair_is_embedded_and_small():
  assert {"ende-target", "ende-draft"} <= set(embedded_names())
  size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(EMBEDDED) for f in files)
  assert size < 80 * 2**20


def test_pair_loads_by_name_with_one_tokenizer(pair):
  target, draft = pair
  assert target.dtype == jnp.float32 and draft.dtype == jnp.float32  # bfloat16 on disk, float32 on CPU
  assert target.tokenizer.same_as(draft.tokenizer)
  assert (target.tokenizer.pad_id, target.tokenizer.eos_id) == (0, 1)
  assert draft.num_params < 0.15 * target.num_params


def test_speculative_translation_equals_the_targets(pair):
  target, draft = pair
  texts = ["The house is small.", "Open the file.", "I don't know what he wants."]
  plain = jaxspec.generate(target, texts, max_new_tokens=24)
  spec = jaxspec.generate(target, texts, jaxspec.Speculation(draft, gamma=3), max_new_tokens=24)
  np.testing.assert_array_equal(plain.tokens, spec.tokens)
  assert all(t.strip() for t in spec.texts)
  assert spec.stats.accepted.sum() > 0
