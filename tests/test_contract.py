"""The contracts hold their implementations: every model family's decoder against `models.contract.Decoder` (the
EAGLE-3 head against `HeadDecoder`), every drafter against `decoding.device.drafter.Drafter`. Signatures are compared
with inspect.signature (parameter names, kinds and defaults), and every public method or property of an
implementation must be declared by its protocol, so an undeclared method or keyword fails here. Also the typed
values of the contract (TreeNodes, StepResult, Prefilled, HeadInput, LoopShape)."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.bench.oracle import OracleDecoder, OracleDrafter
from jaxspec.decoding.drafters import model_drafter, ngram, registry
from jaxspec.decoding.drafters.cross_head_drafter import CrossHeadDrafter
from jaxspec.decoding.device.drafter import Drafter, PlainDrafter
from jaxspec.decoding.drafters.head_drafter import HeadDrafter
from jaxspec.decoding.drafters.model_drafter import ModelDrafter
from jaxspec.models import contract, eagle3, t5
from jaxspec.models.decoder_only import CausalDecoder
from jaxspec.decoding.drafters.served_draft import Deferred, ServedDraftModel
from jaxspec.sharding.memory_plan import LoopShape
from stub_models import MarkovDecoder, MarkovEncoderFeatureDecoder, MarkovFeatureDecoder

DECODERS = [CausalDecoder, t5.T5Decoder, model_drafter.VocabResized, OracleDecoder, MarkovDecoder, MarkovFeatureDecoder,
            MarkovEncoderFeatureDecoder]
DRAFTERS = [PlainDrafter, ModelDrafter, HeadDrafter, CrossHeadDrafter, ngram.NGramDrafter, OracleDrafter,
            ServedDraftModel, Deferred]


def _declared(protocol) -> dict[str, object]:
  """{name: function or property} a protocol declares (its own and its bases'), and its attributes (None)."""
  out = {}
  for base in reversed(protocol.__mro__):
    if base in (object, contract.Protocol) or not getattr(base, "_is_protocol", False):
      continue
    out.update({n: v for n, v in vars(base).items() if not n.startswith("_") and (callable(v) or
                                                                                  isinstance(v, property))})
    out.update({n: None for n in getattr(base, "__annotations__", {})})
  return out


def _fields(cls) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def _public(cls) -> dict[str, object]:
  """Public functions and properties defined by cls and its own bases (not object's or a protocol's)."""
  out = {}
  for base in reversed(cls.__mro__):
    if base is object or getattr(base, "_is_protocol", False):
      continue
    out.update({n: v for n, v in vars(base).items() if not n.startswith("_") and (inspect.isfunction(v) or
                                                                                  isinstance(v, property))})
  return out


def _shape(fn) -> list[tuple]:
  return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _check(cls, protocol) -> None:
  declared, public = _declared(protocol), _public(cls)
  undeclared = set(public) - set(declared)
  assert not undeclared, f"{cls.__name__} has methods {sorted(undeclared)} that {protocol.__name__} does not declare"
  for name, spec in declared.items():
    if spec is None or isinstance(spec, property):  # an attribute or a property: a field, constant or property
      assert name in public or name in _fields(cls) or hasattr(cls, name), f"{cls.__name__} lacks {name}"
      continue
    assert name in public, f"{cls.__name__} lacks {protocol.__name__}.{name}"
    assert _shape(public[name]) == _shape(spec), (f"{cls.__name__}.{name}{inspect.signature(public[name])} is not "
                                                  f"{protocol.__name__}.{name}{inspect.signature(spec)}")


@pytest.mark.parametrize("cls", DECODERS, ids=lambda c: c.__name__)
def test_every_decoder_is_the_protocol(cls):
  _check(cls, contract.Decoder)


def test_the_head_is_the_head_protocol():
  _check(eagle3.Eagle3Head, contract.HeadDecoder)


@pytest.mark.parametrize("cls", DRAFTERS, ids=lambda c: c.__name__)
def test_every_drafter_is_the_protocol(cls):
  _check(cls, Drafter)


def test_the_lookup_setting_is_not_a_drafter():
  assert not isinstance(jaxspec.NGramDraft(), Drafter)
  assert isinstance(registry.ngram_drafter(jaxspec.NGramDraft(2)), Drafter)
  assert registry.ngram_drafter(jaxspec.NGramDraft(2)) == ngram.NGramDrafter(2, 1)


def test_an_undeclared_keyword_or_method_fails():
  """The negative controls: the checks above can fail."""
  @dataclasses.dataclass(frozen=True)
  class Extra(MarkovDecoder):
    def step(self, params, cache, tokens, *, tree=None, layers=(), width=1):  # an undeclared keyword
      return super().step(params, cache, tokens, tree=tree, layers=layers)

  @dataclasses.dataclass(frozen=True)
  class Method(MarkovDecoder):
    def step_tree(self, params, cache, tokens, depths, ancestors):  # an undeclared method
      return None

  for cls in (Extra, Method):
    with pytest.raises(AssertionError):
      _check(cls, contract.Decoder)


def test_typed_values():
  nodes = contract.TreeNodes.of(jnp.asarray([[0, 1]], jnp.int64 if jax.config.x64_enabled else jnp.int16),
                                jnp.asarray([[[1, 0], [1, 1]]], jnp.int32))
  assert nodes.depths.dtype == jnp.int32 and nodes.ancestors.dtype == jnp.bool_
  assert len(jax.tree.leaves(nodes)) == 2
  res = contract.StepResult(logits=jnp.zeros((1, 2, 3)), features=None, cache=None)
  assert len(jax.tree.leaves(res)) == 1  # None fields are empty subtrees: a plain step carries no features
  doubled = jax.jit(lambda r: r.replace(logits=r.logits + 1))(res)
  np.testing.assert_array_equal(doubled.logits, np.ones((1, 2, 3)))
  out = contract.Prefilled(cache=None, first=jnp.zeros((2,), jnp.int32))
  assert out.features is None and out.encoder is None
  head_in = eagle3.HeadInput(tokens=jnp.zeros((1, 2), jnp.int32), hidden=jnp.zeros((1, 2, 4)))
  assert [x.shape for x in jax.tree.leaves(head_in)] == [(1, 2), (1, 2, 4)]
  shape = LoopShape(slack=4, verify_tokens=5)
  assert hash(shape) == hash(LoopShape(slack=4, verify_tokens=5)) and not shape.tree and shape.drafter_state == 0


def test_the_drafter_typed_values():
  """`DraftRequest` (propose's one value) and `Verdict` (settle's) hold today's arguments by name, in order;
  `Proposal.nothing` is the proposal of nothing every drafter's `idle` returns."""
  from jaxspec.decoding.device.drafter import DraftRequest, History, Proposal, ProposalSettings, Verdict
  history = History(sequences=jnp.zeros((2, 6), jnp.int32), lengths=jnp.asarray([1, 3], jnp.int32),
                    done=jnp.zeros((2,), bool))
  static = ProposalSettings(gamma=3, cache_len=8, greedy=True, filtering=False)
  assert DraftRequest._fields == ("params", "state", "history", "limit", "static", "knobs", "confidence", "keys",
                                  "some_row_drafts")
  assert Verdict._fields == ("proposal", "history", "lengths", "accepted", "block", "emit", "params", "features")
  request = DraftRequest(None, "state", history, None, static, None, jnp.float32(0), None, False)
  assert request.state == "state" and request._replace(limit=1).limit == 1 and request.limit is None
  nothing = Proposal.nothing(history, static, after="after")
  assert nothing.tokens.shape == (2, 3) and nothing.counts.tolist() == [0, 0] and nothing.q is None
  assert Proposal.nothing(history, static, None, counts=False).counts is None
  verdict = Verdict(nothing, history, history.lengths, jnp.zeros((2,), jnp.int32), None, None)
  assert verdict.params is None and verdict.features is None and verdict.proposal.after == "after"
  # a pytree of arrays (a NamedTuple): it passes through jit when its leaves are arrays
  out = jax.jit(lambda v: v.lengths + v.accepted)(verdict._replace(proposal=nothing.replace(after=None)))
  assert out.tolist() == [1, 3]
  for cls in DRAFTERS:  # every drafter's propose and settle take the one value
    assert list(inspect.signature(cls.propose).parameters) == ["self", "request"], cls
    assert list(inspect.signature(cls.settle).parameters) == ["self", "verdict"], cls
