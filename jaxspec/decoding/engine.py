"""`jaxspec.generate`: the one entry point for plain and speculative decoding.

    out = jaxspec.generate(target, ["translate English to German: Hello."], draft=draft, gamma=5)
    out.tokens, out.lengths, out.stats.alpha, out.stats.tokens_per_iteration

Prompts are padded to a few length buckets (powers of two from 16), so a new prompt of a bucket already seen
does not recompile; batch size, max_new_tokens, gamma, greedy-vs-sampling and whether top-k/top-p are on are
static (one compilation each); temperature, top_k, top_p and seed values are runtime values and never recompile.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import numpy as np

from jaxspec.decoding import loop, sampling
from jaxspec.model import Model
from jaxspec.models.t5 import T5Decoder

MIN_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class DecodeStats:
  """What happened inside the loop; per-row numpy arrays, and batch means as properties.

  alpha is the paper's acceptance-rate estimate: the mean over verified draft positions (those up to and
  including each iteration's first rejection) of beta = sum_x min(p(x), q(x)). At temperature 0 beta is 1 when
  the draft's argmax equals the target's and 0 otherwise. It is NOT accepted / drafted (which also counts the
  positions after a rejection that were never judged).
  """

  iterations: np.ndarray  # [B] target calls per row (each emits 1 to gamma + 1 tokens).
  drafted: np.ndarray  # [B] draft tokens proposed.
  accepted: np.ndarray  # [B] draft tokens accepted by verification (before EOS / max_new_tokens cuts).
  accepted_per_position: np.ndarray  # [B, gamma]: acceptances of draft position j = 1..gamma.
  generated: np.ndarray  # [B] tokens emitted (== output lengths).
  beta_sum: np.ndarray  # [B]
  beta_count: np.ndarray  # [B]

  @property
  def tokens_per_iteration(self) -> float:
    """Mean tokens emitted per target call, bonus/correction token included (1.0 for plain decoding)."""
    return float(self.generated.sum() / max(self.iterations.sum(), 1))

  @property
  def tokens_per_iteration_per_row(self) -> np.ndarray:
    return self.generated / np.maximum(self.iterations, 1)

  @property
  def alpha(self) -> float:
    """Batch estimate of alpha = E[beta] (NaN without a draft)."""
    count = self.beta_count.sum()
    return float(self.beta_sum.sum() / count) if count else float("nan")

  @property
  def alpha_per_row(self) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
      return self.beta_sum / self.beta_count

  @property
  def acceptance_rate(self) -> float:
    """accepted / drafted: a different quantity from alpha (see the class docstring)."""
    drafted = self.drafted.sum()
    return float(self.accepted.sum() / drafted) if drafted else float("nan")

  @property
  def acceptance_per_position(self) -> np.ndarray:
    """[gamma]: fraction of iterations in which draft position j was accepted (batch total)."""
    return self.accepted_per_position.sum(0) / max(self.iterations.sum(), 1)

  @classmethod
  def concatenate(cls, stats: Sequence["DecodeStats"]) -> "DecodeStats":
    """The stats of several generate calls (same gamma) as one, rows stacked: batch means then cover them all."""
    return cls(**{f.name: np.concatenate([getattr(s, f.name) for s in stats])
                  for f in dataclasses.fields(cls)})

  def select(self, rows) -> "DecodeStats":
    """The stats of some rows only (an index, slice or boolean mask over the batch): e.g. drop padding rows."""
    return DecodeStats(**{f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self)})

  def summary(self) -> dict:
    return {"iterations": int(self.iterations.sum()), "generated": int(self.generated.sum()),
            "drafted": int(self.drafted.sum()), "accepted": int(self.accepted.sum()), "alpha": self.alpha,
            "acceptance_rate": self.acceptance_rate, "tokens_per_iteration": self.tokens_per_iteration,
            "acceptance_per_position": self.acceptance_per_position.tolist()}


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  tokens: np.ndarray  # [B, max_new_tokens] int32, no start token, EOS included, pad id after the end.
  lengths: np.ndarray  # [B] tokens generated per row (EOS included).
  stats: DecodeStats
  texts: list[str] | None = None  # Decoded outputs when the target has a tokenizer.


def bucket_length(n: int, max_input_length: int) -> int:
  """The padded prompt length for a longest prompt of n tokens: a power of two >= 16, capped at the max."""
  return min(max(MIN_BUCKET, 1 << math.ceil(math.log2(max(n, 1)))), max(max_input_length, n))


def _check_pair(target: Model, draft: Model) -> None:
  t, d = target.config, draft.config
  if t.vocab_size != d.vocab_size:
    raise ValueError(f"Draft and target vocabularies differ: draft vocab_size {d.vocab_size}, target "
                     f"{t.vocab_size}. Speculative decoding needs one shared vocabulary.")
  for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
    if getattr(t, name) != getattr(d, name):
      raise ValueError(f"Draft and target special ids differ: {name} is {getattr(d, name)} in the draft and "
                       f"{getattr(t, name)} in the target.")
  if target.tokenizer is not None and draft.tokenizer is not None and not target.tokenizer.same_as(
      draft.tokenizer):
    raise ValueError("Draft and target tokenizers differ (same vocabulary size, different token ids): "
                     "the draft's tokens would mean different text to the target.")


def _check_knobs(gamma, max_new_tokens, temperature, top_k, top_p, speculative: bool) -> None:
  if speculative and (not isinstance(gamma, (int, np.integer)) or gamma < 1):
    raise ValueError(f"gamma must be an integer >= 1 (draft tokens per iteration), got {gamma!r}.")
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}.")
  if not math.isfinite(temperature) or temperature < 0:
    raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature!r}.")
  if not isinstance(top_k, (int, np.integer)) or top_k < 0:
    raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}.")
  if not (isinstance(top_p, (int, float, np.floating)) and 0 < top_p <= 1):
    raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}.")


def prepare_inputs(target: Model, inputs, max_input_length: int) -> np.ndarray:
  """Token ids [B, S_bucket] padded with the pad id, from texts, lists of ids, or a padded array."""
  pad = target.config.pad_token_id
  if isinstance(inputs, str):
    raise ValueError("inputs must be a batch: wrap a single text in a list.")
  if isinstance(inputs, np.ndarray) or isinstance(inputs, jax.Array):
    array = np.asarray(inputs)
    if array.ndim != 2:
      raise ValueError(f"inputs as an array must be [batch, length] token ids, got shape {array.shape}.")
    # Trailing pads are padding; the encoder masks every pad id anyway.
    rows: list[Sequence[int]] = [r[:np.flatnonzero(r != pad)[-1] + 1].tolist() if (r != pad).any() else []
                                 for r in array]
  else:
    rows = list(inputs)
  if not rows:
    raise ValueError("inputs is an empty batch.")
  if all(isinstance(r, str) for r in rows):
    if target.tokenizer is None:
      raise ValueError("inputs are texts but the target has no tokenizer: pass token ids.")
    rows = [target.tokenizer.encode(r) for r in rows]
  vocab = target.config.vocab_size
  for i, r in enumerate(rows):
    if len(r) == 0:
      raise ValueError(f"inputs row {i} is empty.")
    if len(r) > max_input_length:
      raise ValueError(f"inputs row {i} has {len(r)} tokens, more than max_input_length={max_input_length}: "
                       f"truncate it or raise max_input_length.")
    if min(r) < 0 or max(r) >= vocab:
      raise ValueError(f"inputs row {i} has token ids outside [0, {vocab}).")
  width = bucket_length(max(len(r) for r in rows), max_input_length)
  ids = np.full((len(rows), width), pad, np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  return ids


def _prepare(target, inputs, draft, gamma, max_new_tokens, temperature, top_k, top_p, max_input_length):
  """Checks the arguments; returns the loop's static settings and the padded input ids [B, S_bucket]."""
  speculative = draft is not None
  _check_knobs(gamma, max_new_tokens, float(temperature), top_k, top_p, speculative)
  if speculative:
    _check_pair(target, draft)
  ids = prepare_inputs(target, inputs, max_input_length)
  cfg = target.config
  settings = loop.LoopSettings(
      target=T5Decoder(cfg), draft=T5Decoder(draft.config) if speculative else None,
      gamma=int(gamma) if speculative else 0, max_new_tokens=int(max_new_tokens), greedy=temperature == 0,
      filtering=temperature > 0 and (top_k > 0 or top_p < 1), eos_id=cfg.eos_token_id, pad_id=cfg.pad_token_id,
      start_id=cfg.decoder_start_token_id)
  return settings, ids


MAX_INPUT_LENGTH = 512  # `generate`'s default longest prompt, in tokens

_prefill = jax.jit(loop.prefill, static_argnums=0)
_run = jax.jit(loop.run, static_argnums=0, donate_argnums=(3, 4))


def generate(target: Model, inputs, *, draft: Model | None = None, gamma: int = 4, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             max_input_length: int = MAX_INPUT_LENGTH) -> GenerateOutput:
  """Decodes `inputs` with `target`, speculatively when `draft` is given.

  At temperature 0 the output equals the target's greedy decode token for token; when sampling it is
  distributed exactly as the target's (after the same temperature / top-k / top-p processing).

  Args:
    target: the model whose output distribution is produced.
    inputs: a list of texts (needs target.tokenizer), a list of token-id lists, or a padded [B, S] int array
      (pad id = target.config.pad_token_id; trailing pads are padding).
    draft: a smaller model with the same vocabulary; None gives plain autoregressive decoding (the baseline).
    gamma: draft tokens per iteration (ignored without a draft).
    max_new_tokens: tokens generated per row at most (EOS included).
    temperature: 0 for greedy; > 0 samples.
    top_k: keep the k most likely tokens (0 = off). top_p: nucleus mass in (0, 1] (1 = off).
    seed: RNG seed; the same seed gives the same output.
    max_input_length: longest accepted prompt, in tokens.
  Returns:
    GenerateOutput with tokens [B, max_new_tokens], lengths [B] and stats.
  """
  settings, ids = _prepare(target, inputs, draft, gamma, max_new_tokens, temperature, top_k, top_p,
                           max_input_length)
  cfg = target.config
  draft_params = draft.params if draft is not None else None
  target_cache, draft_cache = _prefill(settings, target.params, draft_params, ids)
  state = _run(settings, target.params, draft_params, target_cache, draft_cache,
               sampling.SamplingKnobs.create(temperature, top_k, top_p), np.uint32(seed % 2**32))
  sequences, lengths, st = jax.device_get((state.sequences, state.lengths, state.stats))
  generated = lengths - 1
  tokens = sequences[:, 1:1 + max_new_tokens]
  tokens = np.where(np.arange(max_new_tokens)[None] < generated[:, None], tokens, cfg.pad_token_id)
  stats = DecodeStats(iterations=st.iterations, drafted=st.drafted, accepted=st.accepted,
                      accepted_per_position=st.accepted_per_position, generated=generated,
                      beta_sum=st.beta_sum, beta_count=st.beta_count)
  texts = None
  if target.tokenizer is not None:
    texts = [target.tokenizer.decode(t[:n]) for t, n in zip(tokens, generated)]
  return GenerateOutput(tokens=tokens.astype(np.int32), lengths=generated.astype(np.int32), stats=stats,
                        texts=texts)


def compiled_loop_hlo(target: Model, inputs, *, draft: Model | None = None, gamma: int = 4,
                      max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                      max_input_length: int = MAX_INPUT_LENGTH) -> str:
  """The optimised HLO text of the decoding-loop program that `generate` runs for these arguments.

  For profiling (`jaxspec.profiling`): the same shapes and settings give the same compiled program, whose
  instruction names the profiler's kernel events carry. Compiles (or reuses) the program; decodes nothing.
  """
  settings, ids = _prepare(target, inputs, draft, gamma, max_new_tokens, temperature, top_k, top_p,
                           max_input_length)
  draft_params = draft.params if draft is not None else None
  target_cache, draft_cache = jax.eval_shape(functools.partial(_prefill, settings), target.params, draft_params,
                                             ids)
  return _run.lower(settings, target.params, draft_params, target_cache, draft_cache,
                    sampling.SamplingKnobs.create(temperature, top_k, top_p), np.uint32(0)).compile().as_text()
