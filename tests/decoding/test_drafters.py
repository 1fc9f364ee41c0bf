"""Unit tests of each drafter behind the Drafter protocol (jaxspec/decoding/device/drafter.py): what it
proposes for a known context, and the state it settles on after a verdict (the loop-level tests are in test_generate.py,
test_ngram.py, test_adaptive.py and test_sampling_lossless.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.drafters import ngram, registry
from jaxspec.decoding.device import sampling
from jaxspec.decoding.device.drafter import DraftRequest, Drafter, History, PlainDrafter, ProposalSettings, Verdict
from jaxspec.decoding.drafters.model_drafter import ModelDrafter

from stub_models import MarkovDecoder

GAMMA, CACHE_LEN = 3, 12
GREEDY = ProposalSettings(gamma=GAMMA, cache_len=CACHE_LEN, greedy=True, filtering=False)
KNOBS = sampling.SamplingKnobs.create(0.0, 0, 1.0)


def _history(sequences, lengths, done=None) -> History:
  sequences = jnp.asarray(sequences, jnp.int32)
  done = jnp.zeros(sequences.shape[:1], bool) if done is None else jnp.asarray(done)
  return History(sequences=sequences, lengths=jnp.asarray(lengths, jnp.int32), done=done)


def _propose(drafter, params, state, history, limit=None, settings=GREEDY):
  keys = jax.random.split(jax.random.key(0), history.lengths.shape[0])
  return drafter.propose(DraftRequest(params, state, history, limit, settings, KNOBS, jnp.float32(0.0), keys, False))


def test_every_drafter_implements_the_protocol():
  for drafter in (PlainDrafter(), ngram.NGramDrafter(), ModelDrafter(MarkovDecoder())):
    assert isinstance(drafter, Drafter) and hash(drafter) == hash(drafter)  # hashable: a static argument


def test_plain_drafter_proposes_nothing():
  history = _history([[3, 0, 0, 0]], [1])
  settings = ProposalSettings(gamma=0, cache_len=CACHE_LEN, greedy=True, filtering=False)
  proposal = _propose(PlainDrafter(), None, None, history, settings=settings)
  assert proposal.tokens.shape == (1, 0) and proposal.counts is None and proposal.q is None
  assert PlainDrafter().settle(Verdict(proposal, history, jnp.asarray([2]), jnp.asarray([0]), None, None)) is None


def test_ngram_proposes_the_continuation_within_its_limit_and_settles_on_what_was_emitted():
  draft = registry.ngram_drafter(jaxspec.NGramDraft(max_ngram=2))  # the registry makes the setting's drafter
  ids = jnp.asarray([[5, 6, 7, 8, 5, 6], [1, 2, 3, 4, 9, 9]], jnp.int32)  # row 0 repeats "5 6": then 7 8 5
  state = draft.init(None, ids, jnp.asarray([6, 6], jnp.int32), CACHE_LEN)
  history = _history(np.zeros((2, 8)), [1, 1])
  proposal = _propose(draft, None, state, history)
  assert proposal.counts.tolist()[0] == GAMMA and proposal.tokens[0].tolist() == [7, 8, 5]
  assert proposal.q is None  # deterministic proposals: q is one-hot, accepted with probability p(x)
  limited = _propose(draft, None, state, history, limit=jnp.asarray([1, 0], jnp.int32))
  assert limited.counts.tolist()[0] == 1 and limited.counts.tolist()[1] == 0  # the schedule's limit holds
  assert draft.idle(state, history, GREEDY).counts.tolist() == [0, 0]
  block = jnp.asarray([[7, 8, 0, 0], [4, 0, 0, 0]], jnp.int32)
  settled = draft.settle(Verdict(proposal, history, jnp.asarray([3, 2]), jnp.asarray([2, 0]), block,
                                 jnp.asarray([2, 1], jnp.int32)))
  assert settled.lengths.tolist() == [8, 7]  # the context grows by the emitted tokens only
  assert np.asarray(settled.tokens)[0, 6:8].tolist() == [7, 8] and int(settled.tokens[1, 6]) == 4


@pytest.mark.parametrize("accepted,want", [(GAMMA, 1 + GAMMA - 1), (1, 1 + 1), (0, 1)])
def test_model_drafter_keeps_what_was_accepted_and_never_the_newest_token(accepted, want):
  """A caught-up row (lag 0) feeds its last token and x_1..x_{gamma-1}; after the verdict it keeps the fed tokens
  that were accepted, and never the newest token (fed next iteration: REFERENCE.md pitfall 1)."""
  rng = np.random.RandomState(0)
  params = {"table": jnp.asarray(rng.randn(5, 5), jnp.float32),
            "position_bias": jnp.asarray(rng.randn(16, 5), jnp.float32)}
  drafter = ModelDrafter(MarkovDecoder())
  state = drafter.init(params, jnp.ones((1, 4), jnp.int32), jnp.full((1,), 4, jnp.int32), CACHE_LEN)
  history = _history([[0] + [0] * 8], [1])  # one token (the start token), not yet fed
  proposal = _propose(drafter, params, state, history)
  assert proposal.tokens.shape == (1, GAMMA) and proposal.counts is None  # "constant": every row drafts gamma
  new_lengths = history.lengths + accepted + 1
  settled = drafter.settle(Verdict(proposal, history, new_lengths, jnp.asarray([accepted]), None, None))
  assert settled.positions.tolist() == [want]
  assert int(settled.positions[0]) <= int(new_lengths[0]) - 1
  idle = drafter.idle(settled, history, GREEDY)
  assert idle.counts.tolist() == [0]
  assert drafter.settle(Verdict(idle, history, new_lengths, jnp.asarray([0]), None, None)).positions.tolist() == [
      want]
