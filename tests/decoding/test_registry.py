"""The one registration of drafter kinds (jaxspec/decoding/drafters/registry.py): docs/drafters.md's worked example,
a drafter module plus one `KINDS` entry, drafts in `jaxspec.generate` with nothing else changed; an unregistered
setting is one clear error."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jaxspec
from jaxspec.decoding.drafters import registry
from jaxspec.decoding.drafters.served_draft import Deferred, ServedDraftModel
from jaxspec.decoding.device.drafter import DraftSource, PlainDrafter, Proposal
from jaxspec.models import t5


# --- the example module (as it would be drafters/repeat.py), word for word as in docs/drafters.md ---------------

@dataclasses.dataclass(frozen=True)
class RepeatDraft:
  """The user's setting: jaxspec.Speculation(RepeatDraft(), gamma=...)."""

  name: str = "repeat"


@dataclasses.dataclass(frozen=True)
class RepeatDrafter:
  """Proposes the row's last token again, gamma times (deterministic, like prompt lookup)."""

  may_find_nothing: bool = False
  default_cost: float = 0.0
  feature_layers: tuple[int, ...] = ()
  reads_encoder: bool = False

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None):
    return None  # no state

  def propose(self, request):
    history, static = request.history, request.static
    tokens = jnp.broadcast_to(history.last[:, None], (history.lengths.shape[0], static.gamma))
    # counts: limit (None under schedule "constant": every row proposes gamma); q None: deterministic (one-hot)
    return Proposal(tokens=tokens, counts=request.limit, q=None, after=request.state)

  def idle(self, state, history, static):
    return Proposal.nothing(history, static, state)  # every count 0, the state unchanged

  def settle(self, verdict):
    return verdict.proposal.after

  def propose_tree(self, params, state, history, static, knobs, keys):
    raise ValueError("RepeatDrafter drafts chains only.")


def source(target, setting: RepeatDraft) -> DraftSource:
  """The registration's factory: the loop's drafter and the params it reads (none)."""
  return DraftSource(RepeatDrafter(), owner=setting)

# --- end of the example -----------------------------------------------------------------------------------------


@pytest.fixture
def registered(monkeypatch):
  """The one registration line, `Kind(repeat.RepeatDraft, repeat.source, "a RepeatDraft")` in KINDS."""
  monkeypatch.setattr(registry, "KINDS", registry.KINDS + (registry.Kind(RepeatDraft, source, "a RepeatDraft"),))


@pytest.fixture(scope="module")
def target():
  cfg = t5.T5Config(vocab_size=24, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=2, num_heads=2,
                    eos_token_id=1)
  return jaxspec.Model(cfg, t5.init_params(cfg, jax.random.key(5)), name="tiny")


@pytest.mark.usefixtures("registered")
@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_a_registered_kind_drafts_in_generate_and_stays_exact(target, schedule):
  prompts = [[5, 6, 7, 8, 1], [9, 9, 1], [3, 4, 5, 6, 7, 8, 9, 10, 1]]
  plain = jaxspec.generate(target, prompts, max_new_tokens=12)
  spec = jaxspec.Speculation(RepeatDraft(), gamma=3, schedule=schedule)
  assert spec.describe().startswith("repeat gamma=3")
  out = jaxspec.generate(target, prompts, spec, max_new_tokens=12)
  assert (out.tokens == plain.tokens).all() and (out.lengths == plain.lengths).all()
  assert out.stats.drafted.sum() > 0  # it did draft: the output equal to plain is the verifier's doing


def test_an_unregistered_kind_is_one_clear_error(target):
  """The registry checks the kind when the draft source is made (settings.py imports no drafter)."""
  spec = jaxspec.Speculation(RepeatDraft(), gamma=3)
  with pytest.raises(jaxspec.errors.SettingsError, match="Speculation.draft must be .*NGramDraft.* got RepeatDraft"):
    jaxspec.generate(target, [[5, 6, 1]], spec, max_new_tokens=4)


def test_the_slot_engine_gets_a_draft_model_wrapped_for_its_load_table(target):
  """`registry.served`: a draft model's insert defers its prefill (`Deferred`), and under a table with plain or
  tree entries it is wrapped to catch up (drafters/served_draft.py); any other drafter is served as it is, with
  no insert form (the slot engine names no drafter class: tests/test_layers.py)."""
  model = registry.draft_source(target, jaxspec.Speculation(target, gamma=2)).drafter
  plain = registry.served(model, lags=False)
  assert plain.drafter == model and isinstance(plain.insert, Deferred) and plain.insert.inner == model
  chained = registry.served(model, lags=True)
  assert isinstance(chained.drafter, ServedDraftModel) and chained.drafter.inner == model
  assert isinstance(chained.insert, Deferred) and chained.insert.inner == chained.drafter
  lookup = registry.draft_source(target, jaxspec.Speculation(jaxspec.NGramDraft(), gamma=2)).drafter
  assert plain.rest is None and isinstance(chained.rest, PlainDrafter)  # a lagging draft's plain steps leave it out
  assert registry.served(lookup, lags=True) == (lookup, None, None)
