"""Text in, text out over files: what launch/translate.py and launch/generate.py run, callable from a notebook.

    target, draft = load_pair("ende-target", "ende-draft")
    run = generate_texts(texts, target, jaxspec.Speculation(draft, gamma=3), batch_size=8)

    target = load_target("ende-target")                 # a pool of drafts, the choice measured on the first inputs
    drafts = load_drafts("ende-draft,ngram", target)
    choice = calibrate(target, drafts, texts, gammas=(1, 2, 3, 4), batch_size=1)
    run = generate_texts(texts, target, choice.speculation, batch_size=1)

One output line per input item (`jaxspec.tools.inputs` for the rule), printed next to its input or appended to
`output` as batches finish (`open_output`, from `jaxspec.cli.resume`: checked, locked and fingerprinted; a
`jaxspec.tools.outputs.LineWriter`: resumable, only complete lines count), then the speed
summary (`jaxspec.bench.report.speed_summary`). Family-agnostic: any model `jaxspec.load` reads whose tokenizer
encodes and decodes text; `chat` applies the tokenizer's chat template to every input.
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

import jaxspec
from jaxspec.tools.batching import BatchRun, generate_all
from jaxspec.decoding.generation import MAX_INPUT_LENGTH
from jaxspec.bench import loop as bench_loop
from jaxspec.bench import tune
from jaxspec.bench.report import speed_summary, tune_table
from jaxspec.tools.inputs import InputError, encode_texts
from jaxspec.models import eagle3
from jaxspec.tools.outputs import LineWriter
from jaxspec.cli.resume import open_output  # pylint: disable=unused-import (the scripts' entry: checked, locked)
from jaxspec.decoding.drafters.model_drafter import draft_decoder

NGRAM = "ngram"  # the draft name of jaxspec.NGramDraft() (prompt lookup, no model)
RANDOM = "random:"  # "random:NAME": NAME's shape and tokenizer, random untied weights (a draft that is never right;
# a feature head keeps its draft vocabulary)


def load_target(name: str, mesh=None) -> jaxspec.Model:
  """The target for text generation (InputError without a tokenizer); with a mesh, loaded into its shards."""
  target = jaxspec.load(name, mesh=mesh)
  if target.tokenizer is None:
    raise InputError(f"{name} has no tokenizer: text in and out needs one.")
  return target


def _load_draft(name: str, target: jaxspec.Model, mesh=None):
  if name == NGRAM:
    return jaxspec.NGramDraft()
  model = jaxspec.load(name.removeprefix(RANDOM))
  if isinstance(model, jaxspec.FeatureHead):  # an EAGLE-3 head: it drafts from this target's hidden states
    eagle3.check_fits(model.config, target.config, model.params)  # one CheckpointError naming each mismatch
    return _random_head(model, name) if name.startswith(RANDOM) else model
  if name.startswith(RANDOM):
    # Untied: a tied output embedding scores the input token highest through the residual, and a random draft
    # would then propose repeats, which a target's repetition loops accept (alpha 0.42 on the embedded pair).
    config = model.config
    if getattr(config, "tie_word_embeddings", False):
      config = dataclasses.replace(config, tie_word_embeddings=False)
    model = jaxspec.Model.random(config, seed=1, dtype=model.dtype, name=name, tokenizer=model.tokenizer)
  if mesh is not None:
    model = jaxspec.shard(model, mesh, rules=jaxspec.DRAFT_RULES)
  if model.tokenizer is not None and not model.tokenizer.same_as(target.tokenizer):
    raise InputError(f"the draft's tokenizer ({name}) differs from the target's ({target.name}): "
                     "speculative decoding needs the same token ids on both sides.")
  try:
    draft_decoder(target, model)  # every other pair check of generate (vocabularies, families), before any batch
  except ValueError as e:
    raise InputError(f"--draft={name}: {e}") from None
  return model


def _random_head(head: jaxspec.FeatureHead, name: str) -> jaxspec.FeatureHead:
  """The head's shapes and draft vocabulary with random weights, N(0, 0.02) (norms 1), drawn by numpy (no
  compilation per array); its own embedding stays when it has one."""
  rng, dtype = np.random.default_rng(1), head.params["fc"].dtype

  def draw(path, shape):
    return jnp.asarray(np.ones(shape) if path[-1].key.endswith("norm") else rng.normal(0.0, 0.02, shape), dtype)
  weights = jax.tree_util.tree_map_with_path(draw, eagle3.param_shapes(head.config),
                                             is_leaf=lambda x: isinstance(x, tuple))
  keep = {k: head.params[k] for k in ("d2t", "t2d", "embedding") if k in head.params}
  return jaxspec.FeatureHead(head.config, {**weights, **keep}, name=name)


def default_draft(target: jaxspec.Model, draft: str, explicit: bool, target_name: str, doing: str) -> str:
  """The --draft a launch script uses: `draft` as given when the user named it (`explicit`) or it is empty, else
  (left at its default) itself when it can draft for `target` (same family kind and tokenizer), or '' (plain
  decoding, said on stderr, `doing` naming what the script then does plainly: "decoding", "serving")."""
  if explicit or not draft:
    return draft
  default = jaxspec.load(draft)
  if (target.family.encoder_decoder == default.family.encoder_decoder and target.tokenizer is not None
      and target.tokenizer.same_as(default.tokenizer)):
    return draft
  print(f"--draft left at its default {draft!r}, which cannot draft for {target_name} (another tokenizer or "
        f"family): {doing} plainly; pass --draft to speculate.", file=sys.stderr)
  return ""


def load_drafts(spec: str, target: jaxspec.Model, mesh=None) -> dict:
  """{name: draft} from comma-separated names: 'ngram' (jaxspec.NGramDraft()), 'random:NAME', or what
  jaxspec.load reads (embedded names, model directories, EAGLE-3 head directories: a `jaxspec.FeatureHead`,
  checked against the target); '' gives {} (plain decoding). With a mesh, model drafts are replicated over
  `model` (jaxspec.DRAFT_RULES); a head's weights are replicated on the mesh when it first decodes there."""
  names = [n.strip() for n in spec.split(",") if n.strip()]
  if len(set(names)) != len(names):
    raise InputError(f"--draft={spec}: a draft is named twice.")
  return {n: _load_draft(n, target, mesh) for n in names}


def load_pair(target_name: str, draft_name: str | None, mesh=None):
  """(target, draft or None) for text generation; InputError when they cannot work together on text. With a
  mesh, the target loads straight into its shards and the draft is replicated over `model` (jaxspec.DRAFT_RULES)."""
  target = load_target(target_name, mesh)
  drafts = load_drafts(draft_name or "", target, mesh)
  if len(drafts) > 1:
    raise InputError(f"--draft={draft_name}: one draft expected here, got {len(drafts)}.")
  return target, next(iter(drafts.values()), None)


def calibrate(target: jaxspec.Model, drafts: dict, texts: list[str], *, gammas, batch_size: int = 1,
              sampling: jaxspec.Sampling | None = None, max_new_tokens: int = 64,
              max_input_length: int = MAX_INPUT_LENGTH, prefix: str = "", inputs: int = 16, repeats: int = 3,
              schedules=("constant", "adaptive"), trees=()) -> tune.Choice:
  """The tuner (`jaxspec.tune`) on up to `inputs` of the texts (those of their most common prompt-length bucket:
  one compilation per variant) at this job's batch size and sampling settings, `repeats` interleaved rounds.
  Prints the table, the choice and why; returns the choice (plain decoding when no variant is measured faster
  than plain by more than its spread; a variant that drafted nothing is plain decoding)."""
  sampling = jaxspec.Sampling() if sampling is None else sampling
  temperature = sampling.temperature
  ids = [i for i in encode_texts(target.tokenizer, texts, prefix=prefix, max_input_length=max_input_length) if i]
  if not ids:
    return tune.Choice(temperature, batch_size, None, why="no non-empty input to calibrate on")
  _, ids = bench_loop.common_bucket(ids, inputs)
  main = jaxspec.is_main_process()
  if main:
    shapes = [f"tree {t.top_k},{t.nodes}" for t in trees]
    print(f"calibrating on {len(ids)} inputs: drafts {', '.join(drafts)} x gammas {list(gammas)} x "
          f"{', '.join(list(schedules) + shapes)}, batch {batch_size}, temperature {temperature:g}", file=sys.stderr)
  result = tune.tune(target, drafts, ids, gammas=gammas, batch_sizes=(batch_size,), temperatures=(temperature,),
                     schedules=schedules, trees=trees, top_k=sampling.top_k, top_p=sampling.top_p, repeats=repeats,
                     max_new_tokens=max_new_tokens,
                     itl=False, max_input_length=max_input_length, verbose=False)
  choice = result.best[(temperature, batch_size)]
  if main:
    print("\n".join(tune_table(result.rows)) + f"\nchosen: {choice.describe()}: {choice.why}\n", flush=True)
  return choice


def _resume_point(writer: LineWriter | None) -> int:
  """Lines already written: the main process's count, shared with every process (only it holds the output)."""
  done = writer.done if writer is not None else 0
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    done = int(multihost_utils.broadcast_one_to_all(np.int32(done)))
  return done


def generate_texts(texts: list[str], target, speculation: jaxspec.Speculation | None = None,
                   sampling: jaxspec.Sampling | None = None, *, writer: LineWriter | None = None, prefix: str = "",
                   chat: bool = False, long_inputs: str = "truncate", compare: bool = True, desc: str = "generate",
                   **kw) -> BatchRun | None:
  """Generates one output per text (kw: `batching.generate_all`'s batch_size, max_new_tokens, max_input_length
  and seed), prints or writes them, then prints the speed summary. Returns the run, or None when there was
  nothing to generate."""
  sampling = jaxspec.Sampling() if sampling is None else sampling
  ids = encode_texts(target.tokenizer, texts, prefix=prefix, chat=chat,
                     max_input_length=kw.get("max_input_length", MAX_INPUT_LENGTH), long_inputs=long_inputs)

  main = jaxspec.is_main_process()

  def emit(idx: list[int], outs: list[str]) -> None:
    if not main:
      return
    if writer is not None:
      writer.write(outs)
    else:
      for i, out in zip(idx, outs):
        tqdm.write(f"{texts[i]}\n  -> {out}", file=sys.stdout)  # Above the progress bar, not through it.
      sys.stdout.flush()

  run = generate_all(target, ids, speculation, sampling, compare=compare, start=_resume_point(writer),
                     on_batch=emit, desc=desc, **kw)
  if not run.stats_parts:
    print("nothing to generate.")
    return None
  if main:
    print("\n" + "\n".join(speed_summary(run, target, speculation, sampling, kw.get("batch_size", 1))))
  return run
