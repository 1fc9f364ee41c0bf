"""`ModelDrafter`: a smaller model of the target's tokenizer drafts (the paper's drafter; device/drafter.py's `Drafter`),
and `draft_decoder`, the check that a draft model and a target can speculate together.

Each iteration it catches its cache up with the accepted sequence, then drafts.

Loop positions as in loop.py: row b holds L = lengths[b] tokens, the last one not yet fed to any model; the draft
has fed dlen = draft_cache.positions[b] <= L - 1 of them, so it lags by lag = L - 1 - dlen tokens.

Catch-up: ONE draft call feeds each row's tokens from dlen on and gives the distribution after the last token.
Its width W is static, picked per iteration (`lax.switch`) from the largest lag among the rows that draft:
  1 token (lag 0) or 2 (lag 1: the row accepted all its drafts and never fed the last one, REFERENCE.md pitfall
  1); with variable lengths also gamma + 1 tokens (lag <= gamma: a short fallback stretch) and, for longer lags,
  a re-feed of the whole sequence from position 0 (cache_len tokens: the first probe after a rest longer than
  gamma iterations makes one). A wider
  call never writes past the cache: dlen + gamma + 1 <= cache_len, and the re-feed starts at 0.
A row that does not draft this iteration may lag more than W - 1; it is fed what fits and stays behind.

Drafting (`chain.LearnedDrafter`, shared with the feature heads): `_propose_fixed` (schedule "constant": `limit`
None) draws gamma tokens for every row with a `lax.scan`
of gamma - 1 single-token calls. `_propose_variable` draws at most limit[b] tokens for row b and stops a row after
a token whose distribution's top probability is below draft_confidence; its `lax.while_loop` makes single-token
calls only while some row still drafts, so at batch 1 a short draft costs only its own steps.

After verification, `ModelDrafter.settle` rolls the cache back to the tokens it fed that were accepted (never past
the last).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxspec.decoding.device import schedules
from jaxspec.decoding.drafters import chain
from jaxspec.decoding.device.drafter import ProposalSettings
from jaxspec.errors import SettingsError
from jaxspec.models.contract import Decoder, TreeNodes
from jaxspec.models.loaded import Model


@struct.dataclass
class Drafted:
  """The draft cache after proposing, with what `settle` needs to roll it back (Proposal.after)."""

  cache: Any  # the draft cache, positions at base + steps.
  base: jax.Array  # [B] int32 positions after the catch-up call (L for a caught-up row).
  steps: jax.Array  # [] int32 single-token calls made after it (each fed x_1, x_2, ... to every row).


def catch_up(decoder: Decoder, static: ProposalSettings, params: Any, cache: Any, sequences: jax.Array,
             lengths: jax.Array, needed: jax.Array, variable: bool, refeed: bool | None = None
             ) -> tuple[jax.Array, Any, jax.Array]:
  """One draft call feeding each row from its cache position on (see the module docstring).

  Args:
    sequences: [B, N] the loop's tokens; lengths: [B]; needed: [B] bool rows that draft (their lag picks W).
    variable: static; False compiles only the 1- and 2-token calls (the lag is then at most 1).
    refeed: static; whether to compile the re-feed from position 0 (default: variable). A tree drafter lags at
      most gamma tokens (it keeps none of its tree), so it compiles the gamma + 1 call but no re-feed.
  Returns:
    (logits [B, V] after each row's last token (junk for rows still behind), cache at positions base,
    base [B] int32 = min(start + W, L)).
  """
  dlen = cache.positions
  lag = jnp.max(jnp.where(needed, lengths - 1 - dlen, 0))
  widths = [1, 2] + ([static.gamma + 1] if variable and static.gamma > 1 else [])
  refeed = variable if refeed is None else refeed
  branches = [(w, False) for w in widths] + ([(static.cache_len, True)] if refeed else [])

  def feed(width: int, from_start: bool):
    def call(cache):
      start = jnp.zeros_like(dlen) if from_start else dlen
      tokens = jnp.take_along_axis(sequences, jnp.clip(start[:, None] + jnp.arange(width)[None], 0,
                                                       sequences.shape[1] - 1), axis=1)  # [B, W]
      with jax.named_scope("draft_step"):
        res = decoder.step(params, cache.rollback(start), tokens)
        logits, cache = res.logits, res.cache
      at = jnp.clip(lengths - 1 - start, 0, width - 1)
      base = jnp.minimum(start + width, lengths)
      return jnp.take_along_axis(logits, at[:, None, None], axis=1)[:, 0], cache.rollback(base), base
    return call

  index = sum((lag > w - 1).astype(jnp.int32) for w in widths[:len(branches) - 1])
  return jax.lax.switch(index, [feed(w, s) for w, s in branches], cache)


@dataclasses.dataclass(frozen=True)
class ModelDrafter(chain.LearnedDrafter):
  """A draft model behind the `Drafter` protocol. decoder: the draft's `Decoder` (its weights come as params).
  Propose, idle and the tree's skeleton are `chain.LearnedDrafter`'s; this class gives its catch-up call and steps."""

  decoder: Decoder
  may_find_nothing: bool = False
  default_cost: float = schedules.DEFAULT_DRAFT_COST
  feature_layers: tuple[int, ...] = ()
  reads_encoder: bool = False

  def init(self, params, input_ids, input_lengths, cache_len, features=None, encoder=None):
    return self.decoder.prefill(params, input_ids, input_lengths, cache_len).cache

  def state_axes(self):
    return self.decoder.cache_axes()

  def settle(self, verdict):
    """A caught-up row keeps the last token and the x_1..x_steps it fed that were accepted; a row still behind
    keeps what its catch-up fed; never more than lengths - 1 (the newest token is fed next iteration). After a
    tree (steps 0) that is the tree-free cache: the next catch-up feeds the accepted tokens (at most gamma + 1)."""
    after, history = verdict.proposal.after, verdict.history
    kept = jnp.where(after.base == history.lengths, history.lengths + jnp.minimum(verdict.accepted, after.steps),
                     after.base)
    return after.cache.rollback(jnp.minimum(kept, verdict.lengths - 1))

  def _begin(self, params, cache, history, static, needed, variable, refeed):
    """The catch-up call (`catch_up`): (the first draft's logits, the cache, base)."""
    return catch_up(self.decoder, static, params, cache, history.sequences, history.lengths, needed,
                    variable=variable, refeed=refeed)

  def _step(self, params: Any):
    """The chain's step (chain.Step): one token per row [B] fed to the draft model."""
    def step(cache, token):
      with jax.named_scope("draft_step"):
        res = self.decoder.step(params, cache, token[:, None])
      return res.logits[:, 0], res.cache
    return step

  def _drafted(self, state, cache, base, steps):
    return Drafted(cache=cache, base=base, steps=steps)

  def _rested(self, cache):
    return Drafted(cache=cache, base=cache.positions, steps=jnp.int32(0))

  def _row_limit(self, limit, base, lengths):
    """Rows still behind after the catch-up call draft nothing."""
    return jnp.where(base == lengths, limit, 0)

  def _vocab(self, params, cache, history):
    return jax.eval_shape(lambda c: self.decoder.step(params, c, history.sequences[:, :1]).logits, cache).shape[-1]

  def _beam_step(self, params, rank):
    """A tree depth's beam fed once through the draft's `step` with its tree nodes."""
    def beam_step(cache, tokens, depths, ancestors):
      with jax.named_scope("draft_step"):
        res = self.decoder.step(params, cache, tokens, tree=TreeNodes.of(depths, ancestors))
      return rank(res.logits), res.cache
    return beam_step


@dataclasses.dataclass(frozen=True)
class VocabResized:
  """A draft decoder whose logits are cut or padded (with -inf: never proposed) to the target's vocabulary size,
  for pairs whose embeddings differ only by padding rows beyond their shared tokenizer."""

  inner: Decoder
  vocab_size: int

  @property
  def num_feature_layers(self) -> int:
    return self.inner.num_feature_layers

  @property
  def feature_size(self) -> int:
    return self.inner.feature_size

  def cache_axes(self):
    return self.inner.cache_axes()

  def prefill(self, params, input_ids, input_lengths, cache_len, *, layers=(), encoder=False):
    return self.inner.prefill(params, input_ids, input_lengths, cache_len, layers=layers, encoder=encoder)

  def step(self, params, cache, tokens, *, tree=None, layers=()):
    res = self.inner.step(params, cache, tokens, tree=tree, layers=layers)
    return res.replace(logits=self._resized(res.logits))

  def _resized(self, logits):
    v = logits.shape[-1]
    if v >= self.vocab_size:
      return logits[..., :self.vocab_size]
    pad = jnp.full(logits.shape[:-1] + (self.vocab_size - v,), -jnp.inf, logits.dtype)
    return jnp.concatenate([logits, pad], axis=-1)


def draft_decoder(target: Model, draft: Model) -> Decoder:
  """The draft's decoder for this target, after checking that the two can speculate together."""
  tf, df = target.family, draft.family
  if tf.encoder_decoder != df.encoder_decoder:
    raise SettingsError(f"the draft is a {df.name} model and the target a {tf.name} model: an encoder-decoder and a "
                     f"decoder-only model cannot draft for each other.")
  tt, dt = target.tokenizer, draft.tokenizer
  if tt is not None and dt is not None and not tt.same_as(dt):
    raise SettingsError("Draft and target tokenizers differ (different token ids): the draft's tokens would mean "
                     "different text to the target.")
  if tf.name != df.name and (tt is None or dt is None):
    raise SettingsError(f"the draft is a {df.name} model and the target a {tf.name} model: a pair of two families "
                     f"needs both tokenizers to prove they share token ids.")
  t, d = target.config, draft.config
  if tf.encoder_decoder:
    for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
      if getattr(t, name) != getattr(d, name):
        raise SettingsError(f"Draft and target special ids differ: {name} is {getattr(d, name)} in the draft and "
                         f"{getattr(t, name)} in the target.")
  decoder = draft.decoder()
  if t.vocab_size == d.vocab_size:
    return decoder
  shared = tt.vocab_size if tt is not None and dt is not None else None
  if shared is None or shared > min(t.vocab_size, d.vocab_size):
    raise SettingsError(f"Draft and target vocabularies differ: draft vocab_size {d.vocab_size}, target "
                     f"{t.vocab_size}. Speculative decoding needs one shared vocabulary (sizes may differ only by "
                     f"padding rows beyond a shared tokenizer's {shared or 'unknown'} tokens).")
  return VocabResized(decoder, t.vocab_size)
