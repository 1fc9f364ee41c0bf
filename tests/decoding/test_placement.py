"""Placement (jaxspec/decoding/placement.py): a draft is placed on the target's mesh once, not per call, and only
after the memory check (the mesh cases with 8 devices are in tests/sharding/)."""

import jax
import pytest

import jaxspec
from jaxspec import sharding
from jaxspec.decoding import placement
from jaxspec.models import t5


def _pair():
  cfg = t5.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)
  return jaxspec.Model.random(cfg, 0, name="target"), jaxspec.Model.random(cfg, 1, name="draft")


def test_a_draft_is_placed_on_the_targets_mesh_once(monkeypatch):
  target, draft = _pair()
  placed = sharding.shard(target, sharding.make_mesh(1, 1, devices=jax.devices()[:1]))
  calls = []
  real_place = placement.place
  monkeypatch.setattr(placement, "place", lambda x, s: calls.append(1) or real_place(x, s))
  speculation = jaxspec.Speculation(draft, gamma=2)
  first = jaxspec.generate(placed, [[5, 6, 1]], speculation, max_new_tokens=4)
  leaves = len(jax.tree.leaves(draft.params))
  assert len(calls) == leaves  # every draft weight placed, once
  again = jaxspec.generate(placed, [[7, 8, 9, 1]], speculation, max_new_tokens=4)
  assert len(calls) == leaves  # the second call reuses the placed copy
  plain = jaxspec.generate(target, [[5, 6, 1]], speculation, max_new_tokens=4)
  assert first.tokens.tolist() == plain.tokens.tolist() and again.lengths.shape == (1,)


def test_memory_is_checked_before_any_draft_weight_moves(monkeypatch):
  target, draft = _pair()
  placed = sharding.shard(target, sharding.make_mesh(1, 1, devices=jax.devices()[:1]))
  calls = []
  monkeypatch.setattr(placement, "place", lambda x, s: calls.append(1))
  with pytest.raises(jaxspec.CacheTooLargeError):
    jaxspec.generate(placed, [[5, 6, 1]], jaxspec.Speculation(draft, gamma=2), max_new_tokens=10**9)
  assert not calls
