"""`jaxspec.generate`: the one entry point for plain and speculative decoding, for every model family; and
`jaxspec.lower`, the programs a call runs (for profiling, HLO checks and tests) without decoding.

    out = jaxspec.generate(target, ["translate English to German: Hello."], jaxspec.Speculation(draft, gamma=5))
    out.tokens, out.lengths, out.stats.alpha, out.stats.tokens_per_iteration

Prompts are padded to a few length buckets (powers of two from 16), so a new prompt of a bucket already seen
does not recompile. Static (one compilation each): batch size, max_new_tokens, the bucket, greedy or not, whether
top-k / top-p are on, the drafter's kind and shapes, gamma, the schedule, whether on_tokens is given. Runtime
(never recompile): temperature, top_k, top_p, seed, every other `Speculation` field and the on_tokens callable.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from jaxspec.checks import check_int
from jaxspec.decoding import arguments, memory_guard, placement, planner
from jaxspec.decoding.device import loop, schedules, streaming
from jaxspec.decoding.device.drafter import DraftSource
from jaxspec.decoding.device.sampling import SamplingKnobs
from jaxspec.decoding.device.stats import GenerateOutput
from jaxspec.decoding.settings import Sampling, Speculation
from jaxspec.errors import NonFiniteLogitsError, SettingsError
from jaxspec.models.loaded import Model

MAX_INPUT_LENGTH = 512  # `generate`'s default longest prompt, in tokens
MAX_NEW_TOKENS = 2**30  # the most tokens a call may ask for (positions stay int32; the memory check refuses
# what does not fit)


@dataclasses.dataclass(frozen=True)
class _Call:
  """One call's static settings, inputs and drafter, checked."""

  settings: loop.LoopSettings
  ids: np.ndarray  # [B, S] int32, right-padded to the bucket.
  lengths: np.ndarray  # [B] int32.
  source: DraftSource  # The drafter and the params it reads.
  speculation: Speculation | None
  sampling: Sampling


def _check_int(name: str, value, upper: int) -> None:
  check_int(value, name, 1, upper)


def _prepare(target, inputs, speculation, sampling, max_new_tokens, max_input_length, stream: bool) -> _Call:
  planner.check_models(target, speculation)
  sampling = Sampling() if sampling is None else sampling
  if not isinstance(sampling, Sampling):
    raise SettingsError(f"sampling must be a jaxspec.Sampling or None, got {type(sampling).__name__}.")
  _check_int("max_new_tokens", max_new_tokens, MAX_NEW_TOKENS)
  _check_int("max_input_length", max_input_length, MAX_NEW_TOKENS)
  source = planner.draft_source(target, speculation)
  ids, lengths = arguments.prepare_inputs(target, inputs, max_input_length)
  gamma, tree = (0, None) if speculation is None else (speculation.gamma, speculation.tree)
  settings = planner.plan(target, source.drafter, sampling.mode, max_new_tokens=max_new_tokens, gamma=gamma, tree=tree,
                          schedule="constant" if speculation is None else speculation.schedule,
                          stream=stream).settings
  return _Call(settings, ids, lengths, source, speculation, sampling)


def _knobs(call: _Call) -> schedules.SpeculationKnobs:
  s = call.speculation
  if s is None:
    return schedules.SpeculationKnobs.create()
  cost = call.settings.drafter.default_cost if s.draft_cost is None else s.draft_cost
  return schedules.SpeculationKnobs.create(s.draft_confidence, s.fallback_alpha, s.probe_interval, cost,
                                          s.prior_alpha)


def _placed(call: _Call, target: Model, seed) -> placement.Call:
  """The call's programs and arguments where the target lives, after checking that they fit its memory."""
  seeds, row_ids = arguments.seeds_for_rows(seed, call.ids.shape[0])
  where = placement.plan(target, call.source.model, call.ids.shape[0])
  memory_guard.check_fits(call.settings, where, target, call.source, *call.ids.shape)
  return placement.prepare(where, target, call.source, call.ids, call.lengths, seeds, row_ids)


def generate(target: Model, inputs, speculation: Speculation | None = None, sampling: Sampling | None = None, *,
             max_new_tokens: int = 64, seed=0, max_input_length: int = MAX_INPUT_LENGTH, on_failure: str = "raise",
             on_tokens: Callable[[streaming.TokenChunk], object] | None = None) -> GenerateOutput:
  """Decodes `inputs` with `target`, speculatively when `speculation` is given.

  At temperature 0 the output equals the target's greedy decode token for token; when sampling it is
  distributed exactly as the target's (after the same temperature / top-k / top-p processing).

  Args:
    target: the model whose output distribution is produced (any registered family).
    inputs: a list of texts (needs target.tokenizer; encoded as transformers encodes them, special tokens
      included), a list of token-id lists, or a padded [B, S] integer array (trailing pad ids are padding). For
      T5 these are encoder inputs; for decoder-only models prompts, continued (and not repeated in the output).
    speculation: a `jaxspec.Speculation` (the draft, gamma, schedule and its knobs); None decodes plainly (the
      baseline).
    sampling: a `jaxspec.Sampling` (temperature, top_k, top_p); None is greedy.
    max_new_tokens: tokens generated per row at most (EOS included).
    seed: an integer in [0, 2**31 - 1] shared by the batch (each row draws differently: its index is folded
      in), or one such integer per row (a row's output then depends on its own seed and input only, not on its
      batch neighbours, the batch size or padding rows; with schedule "constant").
    max_input_length: longest accepted input, in tokens.
    on_failure: what happens to rows whose target logits turn NaN or +inf: "raise" (NonFiniteLogitsError
      naming the rows) or "mark" (their output stops before the bad step; `failed` says which rows).
    on_tokens: None, or a callable receiving, once per loop iteration and in order, a `TokenChunk`: `tokens`
      [B, gamma + 1] and `counts` [B] (row b's new tokens are tokens[b, :counts[b]], in output order, EOS
      included; concatenated over chunks they are the row's output), `iteration`, and `time` (host
      time.perf_counter() on arrival). It runs on the host inside the loop (an ordered callback: one host round
      trip per iteration); an exception it raises is raised by generate after the loop. None compiles no
      callback.
  Returns:
    GenerateOutput with tokens [B, max_new_tokens] (only new tokens), lengths [B], stats and failed [B].
  Raises:
    jaxspec.JaxspecError subclasses naming the problem: SettingsError, InputError, CacheTooLargeError (before
    anything is allocated), NonFiniteLogitsError.
  """
  if on_failure not in ("raise", "mark"):
    raise SettingsError(f"on_failure must be 'raise' or 'mark', got {on_failure!r}.")
  call = _prepare(target, inputs, speculation, sampling, max_new_tokens, max_input_length, on_tokens is not None)
  settings = call.settings
  run = _placed(call, target, seed)
  target_cache, draft_state, first = run.prefill(settings, run.target_params, run.draft_params, run.ids,
                                                 run.lengths)
  stream_id = None if on_tokens is None else streaming.register(on_tokens, call.ids.shape[0])
  try:
    state = run.run(settings, run.target_params, run.draft_params, target_cache, draft_state, first,
                    SamplingKnobs.of(call.sampling), run.seeds, run.row_ids, _knobs(call),
                    None if stream_id is None else np.int32(stream_id))
    sequences, lengths, failed, st = run.fetch((state.sequences, state.lengths, state.failed, state.stats))
  finally:
    if stream_id is not None:
      streaming.finish(stream_id)  # raises what on_tokens raised
  if failed.any() and on_failure == "raise":
    raise NonFiniteLogitsError(f"the target's logits became NaN or +inf for rows {np.flatnonzero(failed).tolist()}"
                               f": its weights or inputs are broken (on_failure='mark' returns the other rows).")
  generated = lengths - 1
  tokens = sequences[:, 1:1 + max_new_tokens]
  tokens = np.where(np.arange(max_new_tokens)[None] < generated[:, None], tokens, settings.pad_id)
  stats = st.replace(generated=np.asarray(generated))
  texts = None
  if target.tokenizer is not None:
    texts = [target.tokenizer.decode(t[:n]) for t, n in zip(tokens, generated)]
  return GenerateOutput(tokens=tokens.astype(np.int32), lengths=generated.astype(np.int32), stats=stats,
                        texts=texts, failed=failed)


@dataclasses.dataclass(frozen=True)
class LoweredCall:
  """The two programs a `generate` call runs, lowered (sharded when the target is on a mesh)."""

  prefill: jax.stages.Lowered
  loop: jax.stages.Lowered

  def loop_hlo(self) -> str:
    """The decoding loop's optimised HLO text (compiles it, or reuses the compilation); the profiler's kernel
    events carry its instruction names (`jaxspec.bench.profiling`)."""
    return self.loop.compile().as_text()


def lower(target: Model, inputs, speculation: Speculation | None = None, sampling: Sampling | None = None, *,
          max_new_tokens: int = 64, max_input_length: int = MAX_INPUT_LENGTH,
          on_tokens: Callable[[streaming.TokenChunk], object] | None = None) -> LoweredCall:
  """The programs `generate` runs for the same arguments (the same shapes and static settings give the same
  programs), lowered; `.compile()` gives XLA's program, its HLO text and `memory_analysis()`. Decodes nothing and
  allocates no cache; on_tokens is not called (only whether it is given matters)."""
  stream = on_tokens is not None
  call = _prepare(target, inputs, speculation, sampling, max_new_tokens, max_input_length, stream)
  run = _placed(call, target, 0)
  prefill_args = (call.settings, run.target_params, run.draft_params, run.ids, run.lengths)
  target_cache, draft_state, first = run.prefill.eval_shape(*prefill_args)
  decode = run.run.lower(call.settings, run.target_params, run.draft_params, target_cache, draft_state, first,
                         SamplingKnobs.of(call.sampling), run.seeds, run.row_ids, _knobs(call),
                         np.int32(0) if stream else None)
  return LoweredCall(prefill=run.prefill.lower(*prefill_args), loop=decode)
