"""The slot engine's layout comes from what each cache and drafter state declares (`Decoder.cache_axes`,
`Drafter.state_axes`), never from comparing shapes: for every drafter the declared batch axis of each array is the
axis that grows with the batch of the loop's prefill (checked here by that comparison, at batch 2 and 3), and a
declaration that does not match the state is one SettingsError at construction."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

import jaxspec
from jaxspec.decoding.device import loop
from jaxspec.decoding.device.drafter import PlainDrafter
from jaxspec.errors import SettingsError
from jaxspec.serving import SlotEngine

from test_slot_engine_drafters import TABLE, _case, _llama

KW = dict(max_input_length=32, max_new_tokens=8, iterations_per_step=2, modes=("greedy",))


def _grown_axes(engine) -> tuple:
  """Per array of (target cache, drafter state): the axis whose size differs between prefills of 2 and 3 rows."""
  def leaves(batch):
    ids, lengths = jax.ShapeDtypeStruct((batch, 32), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32)
    out = jax.eval_shape(functools.partial(loop.prefill, engine._alloc), engine.target_params,  # pylint: disable=protected-access
                         engine.draft_params, ids, lengths)[:2]
    return jax.tree_util.tree_leaves(out)
  return tuple(next((d for d, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y), None)
               for a, b in zip(leaves(2), leaves(3)))


@pytest.mark.parametrize("name", ["plain", "ngram", "head", "draft", "served draft", "t5-head"])
def test_declared_batch_axes_are_the_rows(name):
  if name == "plain":
    target, speculation, table = _llama(0), None, None
  else:
    target, speculation = _case("draft" if name == "served draft" else name)
    table = TABLE if name == "served draft" else None  # plain and tree entries: the served draft model's state
  engine = SlotEngine(target, speculation, slots=2, table=table, **KW)
  axes = engine._layout.axes  # pylint: disable=protected-access
  assert axes == _grown_axes(engine), name
  if name == "t5-head":  # T5's cross-attention keys [L, B, ...]: the rows are axis 1
    assert 1 in axes


@dataclasses.dataclass(frozen=True)
class _Misdeclared(PlainDrafter):
  """Plain decoding whose declaration names a state it does not have."""

  def state_axes(self):
    return {"tokens": ("batch", "context")}


def test_a_declaration_that_does_not_match_the_state_is_one_error(monkeypatch):
  from jaxspec.decoding.drafters import registry  # pylint: disable=import-outside-toplevel
  real = registry.draft_source
  monkeypatch.setattr(registry, "draft_source",
                      lambda target, spec: dataclasses.replace(real(target, spec), drafter=_Misdeclared()))
  with pytest.raises(SettingsError, match=r"^the drafter's Drafter.state_axes\(\) does not match the state"):
    SlotEngine(_llama(0), None, slots=2, **KW)
