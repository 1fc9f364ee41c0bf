"""The one registration of drafter kinds: which drafter a `Speculation.draft` setting drafts with.

    source = registry.draft_source(target, speculation)   # generation.py, serving: the loop's drafter, its params
    served = registry.served(source.drafter, lags=...)   # the slot engine: that drafter under a load table

`KINDS` maps each kind of setting a user passes as `jaxspec.Speculation(draft, ...)` to a factory
`make(target, setting) -> DraftSource` (device/drafter.py: the drafter and the params it reads). `draft_source`
accepts exactly these kinds (any other `Speculation.draft` is one SettingsError naming them, raised when `generate`
or the slot engine makes the draft source: `settings.py` stays a leaf that imports no drafter), and `generate` and
the slot engine know drafters only through `draft_source` (and the slot engine through `served`, which wraps a
draft model for a load table: served_draft.py). A new drafter kind is one module of this subpackage (its setting,
its `Drafter`, its factory) and one entry here; nothing in the loop (device/) or in generation.py changes
(docs/drafters.md has a worked example).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from jaxspec.decoding.device.drafter import Drafter, DraftSource, PlainDrafter
from jaxspec.decoding.drafters import model_drafter
from jaxspec.decoding.drafters.cross_head_drafter import CrossHeadDrafter
from jaxspec.decoding.drafters.head_drafter import HeadDrafter
from jaxspec.decoding.drafters.ngram import NGramDrafter
from jaxspec.decoding.drafters.served_draft import Deferred, ServedDraftModel
from jaxspec.decoding.settings import NGramDraft
from jaxspec.errors import SettingsError
from jaxspec.models import eagle3
from jaxspec.models.hf_table import get_path
from jaxspec.models.loaded import FeatureHead, Model


class Kind(NamedTuple):
  """One registered drafter kind."""

  setting: type  # What the user passes as `Speculation.draft` (checked with isinstance).
  make: Callable[[Model, Any], DraftSource]  # (target, setting) -> the loop's drafter and its params; raises
  #                                            SettingsError / CheckpointError when the setting cannot draft for it.
  name: str  # How `Speculation`'s error names the kind to the user.


def head_drafter(target: Model, head: FeatureHead) -> tuple[HeadDrafter, dict]:
  """The loop's drafter for a feature head on `target` and its params {"head", "embed"}: a `CrossHeadDrafter`
  for a T5 target's head (it cross-attends to the encoder), else a `HeadDrafter`.

  Raises:
    CheckpointError: the head does not fit the target (hidden size, vocabulary, layer ids).
  """
  layers = eagle3.check_fits(head.config, target.config, head.params)
  eagle3.warn_if_other_target(head, target)
  embedding = get_path(target.params, target.family.embedding_path)
  params = {"head": head.params, "embed": eagle3.embedding_table(head.params, embedding)}
  kind = CrossHeadDrafter if head.config.cross_attention else HeadDrafter
  return kind(eagle3.Eagle3Head(head.config), layers, target.config.vocab_size), params


def ngram_drafter(setting: NGramDraft) -> NGramDrafter:
  """The loop's drafter for a prompt-lookup setting (its values checked when the setting was made)."""
  return NGramDrafter(int(setting.max_ngram), int(setting.min_ngram))


def _model(target: Model, draft: Model) -> DraftSource:
  decoder = model_drafter.draft_decoder(target, draft)
  return DraftSource(model_drafter.ModelDrafter(decoder), draft.params, model=draft, owner=draft)


def _head(target: Model, head: FeatureHead) -> DraftSource:
  drafter, params = head_drafter(target, head)
  return DraftSource(drafter, params, owner=head)


KINDS: tuple[Kind, ...] = (
    Kind(Model, _model, "a jaxspec.Model"),  # a draft model (from jaxspec.load)
    Kind(FeatureHead, _head, "a jaxspec.FeatureHead"),  # an EAGLE-3 head (from jaxspec.load)
    Kind(NGramDraft, lambda target, setting: DraftSource(ngram_drafter(setting), owner=setting), "a jaxspec.NGramDraft"),
)


def accepts(setting: Any) -> bool:
  """Whether `setting` is of a registered kind (what `Speculation.draft` may be)."""
  return isinstance(setting, tuple(k.setting for k in KINDS))


def kind_names() -> str:
  """The registered kinds for an error message: 'a jaxspec.Model, a jaxspec.FeatureHead or a jaxspec.NGramDraft'."""
  names = [k.name for k in KINDS]
  return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def draft_source(target: Model, speculation: Any) -> DraftSource:
  """What `speculation` (a `jaxspec.Speculation`, or None for plain decoding) drafts with on `target`: the loop's
  drafter and its params, from the first registered kind its draft is an instance of."""
  if speculation is None:
    return DraftSource(PlainDrafter())
  for kind in KINDS:
    if isinstance(speculation.draft, kind.setting):
      return kind.make(target, speculation.draft)
  raise SettingsError(f"Speculation.draft must be {kind_names()}, got {type(speculation.draft).__name__}.")


class Served(NamedTuple):
  """The slot engine's drafters for one speculation under its load table (`served`)."""

  drafter: Drafter  # what every step program drafts with
  insert: Drafter | None  # the insert program's: the step's drafter with a draft model's prompt prefill deferred
  #                        to the row's first drafting step (served_draft.Deferred); None: `drafter` itself.
  # A plain step's drafter when it may leave `drafter`'s state out of the step (PlainDrafter: a served draft model
  # lags through plain steps, its idle and settle leaving its state as it is, so the step need not carry its cache);
  # None: a plain step rests `drafter` (Drafter.idle: a head, prompt lookup keep their state in sync).
  rest: Drafter | None = None


def served(drafter: Drafter, *, lags: bool) -> Served:
  """`drafter` (a `draft_source`'s) as the slot engine runs it under a load table. A draft model's prompt prefill
  waits for the row's first drafting step (the first token comes from the insert without it: `Deferred`), and
  where some table entry runs plain or a tree (`lags`), after which a draft model catches up, it is wrapped in
  `ServedDraftModel`. Every other drafter (a head, prompt lookup, plain decoding) keeps its state in sync on its
  own and is served as it is."""
  if not isinstance(drafter, model_drafter.ModelDrafter):
    return Served(drafter, None)
  wrapped = ServedDraftModel(drafter) if lags else drafter
  return Served(wrapped, Deferred(wrapped), PlainDrafter() if lags else None)
