"""`jaxspec.generate`: the one entry point for plain and speculative decoding, for every model family.

    out = jaxspec.generate(target, ["translate English to German: Hello."], draft=draft, gamma=5)
    out.tokens, out.lengths, out.stats.alpha, out.stats.tokens_per_iteration

Prompts are padded to a few length buckets (powers of two from 16), so a new prompt of a bucket already seen
does not recompile; batch size, max_new_tokens, gamma, greedy-vs-sampling, whether top-k/top-p are on, the
schedule, the drafter's kind (a model or an NGramDraft) and whether on_tokens is given are static (one compilation
each); temperature, top_k, top_p, seed, draft_confidence, fallback_alpha, probe_interval, draft_cost, prior_alpha
and the on_tokens callable itself are runtime values and never recompile.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from jaxspec.decoding import adaptive, arguments, loop, memory_guard, ngram, placement, sampling, streaming
from jaxspec.decoding.arguments import bucket_length  # noqa: F401  (part of this module's interface)
from jaxspec.decoding.stats import DecodeStats, GenerateOutput
from jaxspec.model import Model
from jaxspec.errors import NonFiniteLogitsError

MAX_INPUT_LENGTH = 512  # `generate`'s default longest prompt, in tokens


def _prepare(target, inputs, draft, gamma, max_new_tokens, temperature, top_k, top_p, max_input_length,
             schedule: str = "constant", stream: bool = False):
  """Checks the arguments; returns the loop's static settings, padded input ids [B, S] and lengths [B]."""
  speculative = draft is not None
  lookup = isinstance(draft, ngram.NGramDraft)
  if not isinstance(target, Model) or (speculative and not lookup and not isinstance(draft, Model)):
    raise ValueError("target and draft must be jaxspec.Model objects (from jaxspec.load); draft may also be a "
                     "jaxspec.NGramDraft (prompt lookup).")
  arguments.check_knobs(gamma, max_new_tokens, temperature, top_k, top_p, speculative)
  if not arguments._is_int(max_input_length) or max_input_length < 1:
    raise ValueError(f"max_input_length must be an integer >= 1, got {max_input_length!r}.")
  draft_decoder = draft if lookup else arguments.draft_decoder(target, draft) if speculative else None
  ids, lengths = arguments.prepare_inputs(target, inputs, max_input_length)
  cfg = target.config
  settings = loop.LoopSettings(
      target=target.decoder(), draft=draft_decoder, gamma=int(gamma) if speculative else 0,
      max_new_tokens=int(max_new_tokens), greedy=temperature == 0,
      filtering=temperature > 0 and (top_k > 0 or top_p < 1), eos_ids=tuple(cfg.eos_token_ids),
      pad_id=cfg.pad_token_id, schedule=schedule if speculative else "constant", streaming=stream)
  return settings, ids, lengths


_prefill = jax.jit(loop.prefill, static_argnums=0)
_run = jax.jit(loop.run, static_argnums=0, donate_argnums=(3, 4))


def generate(target: Model, inputs, *, draft: Model | ngram.NGramDraft | None = None, gamma: int = 4,
             max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed=0,
             max_input_length: int = MAX_INPUT_LENGTH, on_failure: str = "raise", schedule: str = "constant",
             draft_confidence: float = 0.0, fallback_alpha: float = 0.0, probe_interval: int = 4,
             draft_cost: float | None = None, prior_alpha: float = 1.0,
             on_tokens: Callable[[streaming.TokenChunk], object] | None = None) -> GenerateOutput:
  """Decodes `inputs` with `target`, speculatively when `draft` is given.

  At temperature 0 the output equals the target's greedy decode token for token; when sampling it is
  distributed exactly as the target's (after the same temperature / top-k / top-p processing).

  Args:
    target: the model whose output distribution is produced (any registered family).
    inputs: a list of texts (needs target.tokenizer; encoded as transformers encodes them, special tokens
      included), a list of token-id lists, or a padded [B, S] integer array (trailing pad ids are padding). For
      T5 these are encoder inputs; for decoder-only models prompts, continued (and not repeated in the output).
    draft: a smaller model with the same tokenizer, or `jaxspec.NGramDraft(max_ngram, min_ngram)` (prompt
      lookup: proposals copied from the input and the output so far, no model); None gives plain autoregressive
      decoding (the baseline).
    gamma: the most draft tokens per row and iteration (ignored without a draft).
    max_new_tokens: tokens generated per row at most (EOS included).
    temperature: 0 for greedy; > 0 samples.
    top_k: keep the k most likely tokens (0 = off). top_p: nucleus mass in (0, 1] (1 = off).
    seed: an integer in [0, 2**31 - 1] shared by the batch (each row draws differently: its index is folded
      in), or one such integer per row (a row's output then depends on its own seed and input only, not on its
      batch neighbours, the batch size or padding rows).
    max_input_length: longest accepted input, in tokens.
    on_failure: what happens to rows whose target logits turn NaN or +inf: "raise" (NonFiniteLogitsError
      naming the rows) or "mark" (their output stops before the bad step; `failed` says which rows).
    schedule: how many tokens each row drafts per iteration (jaxspec.decoding.adaptive): "constant" (gamma
      every iteration), "heuristic" (transformers': +2 after a fully accepted block, -1 otherwise, in [1, gamma])
      or "adaptive" (the length that maximises Theorem 3.8's tokens per cost from the rows' running acceptance
      estimates). At batch > 1 the length is the batch's (the draft steps and the verify call are the batch's).
      Output is exact under every schedule; when sampling, a row's particular sample under "heuristic" or
      "adaptive" depends on its batch neighbours' histories (its distribution does not), so per-row seeds
      reproduce a row on its own only with "constant".
    draft_confidence: in [0, 1), 0 = off; a row stops drafting after a token whose draft distribution's top
      probability is below it (schedules other than "constant").
    fallback_alpha: in [0, 1], 0 = off; when the active rows' mean running acceptance estimate is below it, the
      batch decodes plainly (no draft call, a 1-token target call) and drafts again after `probe_interval` such
      iterations (schedules other than "constant").
    probe_interval: resting iterations between probes (>= 1); doubles after each failed probe.
    draft_cost: c, a draft step's cost relative to a verify call, read by schedule="adaptive"; None: 0 for
      NGramDraft, adaptive.DEFAULT_DRAFT_COST for a draft model.
    prior_alpha: in [0, 1]: each row's acceptance estimate before any evidence (1: optimistic, every row starts
      by drafting); pass the draft's measured acceptance (jaxspec.tune does) so that a useless draft rests from
      the start. draft_confidence, fallback_alpha, probe_interval, draft_cost and prior_alpha are runtime values:
      changing them never recompiles.
    on_tokens: None, or a callable receiving, once per loop iteration and in order, a `TokenChunk`: `tokens`
      [B, gamma + 1] and `counts` [B] (row b's new tokens are tokens[b, :counts[b]], in output order, EOS
      included; concatenated over chunks they are the row's output), `iteration`, and `time` (host
      time.perf_counter() on arrival, for inter-token latency). It runs on the host inside the loop (an ordered
      callback: one host round trip per iteration); an exception it raises is raised by generate after the loop.
      None compiles no callback.
  Returns:
    GenerateOutput with tokens [B, max_new_tokens] (only new tokens), lengths [B], stats and failed [B].
  """
  if on_failure not in ("raise", "mark"):
    raise ValueError(f"on_failure must be 'raise' or 'mark', got {on_failure!r}.")
  adaptive.check(schedule, draft_confidence, fallback_alpha, probe_interval, draft_cost, prior_alpha)
  settings, ids, input_lengths = _prepare(target, inputs, draft, gamma, max_new_tokens, temperature, top_k,
                                          top_p, max_input_length, schedule, on_tokens is not None)
  if draft_cost is None:
    draft_cost = 0.0 if settings.ngram else adaptive.DEFAULT_DRAFT_COST
  spec = adaptive.SpeculationKnobs.create(draft_confidence, fallback_alpha, probe_interval, draft_cost, prior_alpha)
  seeds, row_ids = arguments.seeds_for_rows(seed, ids.shape[0])
  # On a mesh: sharded programs, the batch padded to a multiple of `data` (fetch drops the padding rows).
  call = placement.prepare(_prefill, _run, target, draft if isinstance(draft, Model) else None, ids,
                           input_lengths, seeds, row_ids)
  memory_guard.check_fits(settings, target, draft, *ids.shape)
  target_cache, draft_cache, first = call.prefill(settings, call.target_params, call.draft_params, call.ids,
                                                  call.lengths)
  stream_id = None if on_tokens is None else streaming.register(on_tokens, ids.shape[0])
  try:
    state = call.run(settings, call.target_params, call.draft_params, target_cache, draft_cache, first,
                     sampling.SamplingKnobs.create(temperature, top_k, top_p), call.seeds, call.row_ids, spec,
                     None if stream_id is None else np.int32(stream_id))
    sequences, lengths, failed, st = call.fetch((state.sequences, state.lengths, state.failed, state.stats))
  finally:
    if stream_id is not None:
      streaming.finish(stream_id)  # raises what on_tokens raised
  if failed.any() and on_failure == "raise":
    raise NonFiniteLogitsError(f"the target's logits became NaN or +inf for rows {np.flatnonzero(failed).tolist()}"
                               f": its weights or inputs are broken (on_failure='mark' returns the other rows).")
  generated = lengths - 1
  tokens = sequences[:, 1:1 + max_new_tokens]
  tokens = np.where(np.arange(max_new_tokens)[None] < generated[:, None], tokens, settings.pad_id)
  stats = DecodeStats.from_loop(st, generated)
  texts = None
  if target.tokenizer is not None:
    texts = [target.tokenizer.decode(t[:n]) for t, n in zip(tokens, generated)]
  return GenerateOutput(tokens=tokens.astype(np.int32), lengths=generated.astype(np.int32), stats=stats,
                        texts=texts, failed=failed)


def lowered_programs(target: Model, inputs, *, draft: Model | None = None, gamma: int = 4,
                     max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                     max_input_length: int = MAX_INPUT_LENGTH) -> tuple[jax.stages.Lowered, jax.stages.Lowered]:
  """The (prefill, decoding loop) programs that `generate` runs for these arguments, lowered (sharded when the
  target is on a mesh); `.compile()` gives XLA's program, its HLO text and `memory_analysis()`. Decodes nothing."""
  settings, ids, lengths = _prepare(target, inputs, draft, gamma, max_new_tokens, temperature, top_k, top_p,
                                    max_input_length)
  seeds, row_ids = arguments.seeds_for_rows(0, ids.shape[0])
  call = placement.prepare(_prefill, _run, target, draft, ids, lengths, seeds, row_ids)
  prefill_args = (settings, call.target_params, call.draft_params, call.ids, call.lengths)
  target_cache, draft_cache, first = call.prefill.eval_shape(*prefill_args)
  loop = call.run.lower(settings, call.target_params, call.draft_params, target_cache, draft_cache, first,
                        sampling.SamplingKnobs.create(temperature, top_k, top_p), call.seeds, call.row_ids,
                        adaptive.SpeculationKnobs.create(), None)
  return call.prefill.lower(*prefill_args), loop


def compiled_loop(target: Model, inputs, **kwargs) -> jax.stages.Compiled:
  """The compiled decoding-loop program of `lowered_programs` (same keyword arguments)."""
  return lowered_programs(target, inputs, **kwargs)[1].compile()


def compiled_loop_hlo(target: Model, inputs, **kwargs) -> str:
  """The optimised HLO text of the decoding-loop program that `generate` runs for these arguments.

  For profiling (`jaxspec.bench.profiling`): the same shapes and settings give the same compiled program, whose
  instruction names the profiler's kernel events carry. Compiles (or reuses) the program; decodes nothing.
  Keyword arguments: those of `compiled_loop`.
  """
  return compiled_loop(target, inputs, **kwargs).as_text()
