"""`train_head(target, prompts, workdir, config)`: trains an EAGLE-3 feature head for a decoder-only or a T5
target, with resumable checkpoints, held-out acceptance as it trains, data parallelism on a mesh, and export in
SpecForge's format; launch/train_head.py and notebooks call it.

    result = train_head(target, prompts, "runs/head", HeadTrainConfig(steps=2000), heldout_prompts=held)
    head = jaxspec.load("runs/head/head")          # == result.head: Speculation(head, gamma=3) drafts with it

What a run does, in WORKDIR:
  1. data.json: each prompt followed by the target's own response (`head_data.regenerate`: greedy, or sampled
     with config.temperature), written once; a resumed run reads it back (and refuses one made from other
     prompts, settings or another target).
  2. The draft vocabulary: the config.draft_vocab_size most frequent response tokens (`head_data.draft_vocab`).
  3. Steps: batch k holds the rows `head_data.batch_rows(n, B, k, seed)` (a function of k only); the target's
     features and soft labels are captured for that batch alone (`head_data.capture`), then one AdamW step on
     the training-time test's loss (`head_steps.train_step`).
  4. checkpoints/: Orbax, every config.checkpoint_every steps and at the end (the parameters, the optimizer state,
     the step and what the data was made from). A killed run started again with the same WORKDIR continues from
     its latest checkpoint and reproduces the uninterrupted run: the batch order depends on the step only and
     nothing else is random. Orbax writes a checkpoint under a temporary name and renames it when complete, so a
     kill mid-write leaves the previous one.
  5. Every config.eval_every steps (and at steps 0 and the last) the head drafts for the target on the held-out
     prompts: `jaxspec.generate(target, heldout, Speculation(head, gamma))`, greedy; tokens per iteration
     (target calls saved) and alpha (acceptance) from its DecodeStats.
  6. head/: the final head, `jaxspec.save`d in SpecForge's EAGLE-3 format (config.json + model.safetensors, no
     embed_tokens: the head embeds with the target's table), which `jaxspec.load` reads back.

With a `mesh` (`jaxspec.make_mesh(data=D)`), every batch is split over the mesh's "data" axis and the head's
parameters and optimizer state are replicated: XLA all-reduces the gradients, so a step computes what one device
computes (to float rounding). The target is placed on the mesh by the default rules (`jaxspec.shard`) unless it
already is; a "model" axis shards the target as for decoding.

A T5 target (docs/heads.md, "T5 targets") trains a T5 target's head (`t5_head_config`: architectures
["T5Eagle3Head"], a cross-attention sublayer to the target's encoder output): the prompts are the encoder's
inputs, the regenerated responses the decoder's rows (after its start token); each batch's capture
(`head_data.capture_encdec`) runs the encoder once and hands its output to the loss, whose unroll cross-attends to
it through the head's own (trained) projections. Everything else is the same run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jaxspec
from jaxspec import sharding
from jaxspec.checkpoint.atomic import check_replaceable
from jaxspec.tools.outputs import progress as progress_bar
from jaxspec.checks import check_seed
from jaxspec.errors import ConfigError
from jaxspec.models.loaded import FeatureHead
from jaxspec.models import eagle3
from jaxspec.models.decoder_only.config import DecoderOnlyConfig, Rope
from jaxspec.models.hf_table import get_path
from jaxspec.models.t5 import T5Config
from jaxspec.training import head_data, head_steps


@dataclasses.dataclass(frozen=True)
class HeadTrainConfig:
  """Every setting of a head training run (launch/train_head.py's flags)."""

  steps: int = 1000  # Optimizer steps.
  batch_size: int = 8  # Rows per step (split over the mesh's data axis).
  learning_rate: float = 1e-4  # SpecForge's default (the EAGLE-3 paper: 5e-5).
  warmup_steps: int = 0  # Linear warm-up of the learning rate.
  cosine: bool = True  # Cosine decay of the learning rate to 0 at `steps` (else constant after the warm-up).
  weight_decay: float = 0.0
  clip: float = 0.5  # Gradient clipping by global norm.
  draft_vocab_size: int = 32000  # The head's output vocabulary: the most frequent response tokens.
  ttt_steps: int = 7  # Draft steps unrolled in the training-time test.
  ttt_decay: float = 0.8  # Step i's loss weighs ttt_decay ** i.
  max_new_tokens: int = 256  # Longest regenerated response.
  max_input_length: int = 512  # Longest prompt (tokens).
  temperature: float = 0.0  # Regeneration: 0 greedy, else sampled at this temperature.
  generate_batch_size: int = 8  # Rows per generate call (regeneration and evaluation).
  eval_every: int = 100  # Held-out acceptance every this many steps (0: at the start and the end only).
  eval_gamma: int = 3  # Draft tokens per iteration in the held-out evaluation.
  eval_max_new_tokens: int = 64
  checkpoint_every: int = 100  # 0: only at the end.
  keep_checkpoints: int = 2
  log_every: int = 10
  seed: int = 0  # The head's initialisation, the batch order, regeneration samples.
  progress: bool = True  # A tqdm bar on stderr.
  verbose: bool = True  # Progress lines on stdout (loss, acceptance).

  def check(self, vocab_size: int) -> None:
    """ConfigError naming the first setting out of its range."""
    positive = ("steps", "batch_size", "ttt_steps", "max_new_tokens", "max_input_length", "generate_batch_size",
                "eval_gamma", "eval_max_new_tokens", "keep_checkpoints", "log_every")
    for name in positive:
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name}={value!r}: expected an integer >= 1.")
    for name in ("warmup_steps", "eval_every", "checkpoint_every", "seed"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name}={value!r}: expected an integer >= 0.")
    check_seed(self.seed, error=ConfigError)
    if self.eval_gamma > 256:
      raise ConfigError(f"eval_gamma={self.eval_gamma} must be in [1, 256] (draft tokens per iteration).")
    if not 1 <= self.draft_vocab_size <= vocab_size:
      raise ConfigError(f"draft_vocab_size={self.draft_vocab_size} must be in [1, {vocab_size}] (the target's "
                        f"vocabulary).")
    for name in ("learning_rate", "clip"):
      if not np.isfinite(getattr(self, name)) or getattr(self, name) <= 0:
        raise ConfigError(f"{name}={getattr(self, name)!r}: expected a number > 0.")
    if not 0 < self.ttt_decay <= 1 or not np.isfinite(self.temperature) or self.temperature < 0 or (
        self.weight_decay < 0):
      raise ConfigError(f"ttt_decay={self.ttt_decay} must be in (0, 1], temperature={self.temperature} and "
                        f"weight_decay={self.weight_decay} >= 0.")


_FLAG_NAMES = {"eval_gamma": "gamma"}  # HeadTrainConfig fields whose launch/train_head.py flag has another name


def check_run(workdir: str, config: HeadTrainConfig, num_prompts: int | None = None, flags: bool = False) -> None:
  """What a run can check before the target loads or regenerates anything: the settings that need no target
  (`HeadTrainConfig.check` but the vocabulary), batch_size at most the training prompts, and WORKDIR: not empty,
  not a file or under one, writable; every numeric folder under WORKDIR/checkpoints a checkpoint this training
  wrote (Orbax would read a user's folder as the latest step); WORKDIR/head absent or a head jaxspec wrote (it is
  replaced at the end). Makes nothing. ConfigError (CheckpointError for WORKDIR/head) naming the setting, or the
  flag (--out, --batch_size, ...) with flags=True (launch/train_head.py).
  """
  def name(field: str) -> str:
    return f"--{_FLAG_NAMES.get(field, field)}" if flags else field
  what = "--out" if flags else "workdir"
  if not isinstance(workdir, str) or not workdir.strip():
    raise ConfigError(f"{what} is empty: name a run directory (data, checkpoints and the head go there).")
  existing = os.path.abspath(workdir)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ConfigError(f"{what}={workdir}: {existing} is a file, not a run directory.")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ConfigError(f"{what}={workdir}: cannot write into {existing}.")
  checkpoints = os.path.join(workdir, "checkpoints")
  if os.path.exists(checkpoints) and not os.path.isdir(checkpoints):
    raise ConfigError(f"{what}={workdir}: {checkpoints} is a file, not this training's checkpoint directory.")
  if os.path.isdir(checkpoints):
    for entry in sorted(os.listdir(checkpoints)):
      path = os.path.join(checkpoints, entry)
      if entry.isdigit() and not (os.path.isdir(os.path.join(path, "state")) and
                                  os.path.isdir(os.path.join(path, "meta"))):
        raise ConfigError(f"{what}={workdir}: {path} is not a checkpoint this training wrote (no state/ and meta/ "
                          f"in it): move it out of {checkpoints}, or use another run directory.")
  export_dir = os.path.join(workdir, "head")
  if os.path.lexists(export_dir):
    check_replaceable(export_dir, ("config.json",))  # CheckpointError naming what else is there
  try:
    config.check(vocab_size=2**31 - 1)
  except ConfigError as e:
    field = str(e).split("=", 1)[0]
    raise ConfigError(f"{name(field)}{str(e)[len(field):]}" if field.isidentifier() else str(e)) from None
  if num_prompts is not None and config.batch_size > num_prompts:
    raise ConfigError(f"{name('batch_size')}={config.batch_size} exceeds the {num_prompts} training rows (one per "
                      f"prompt).")


@contextlib.contextmanager
def _quiet_orbax():
  """Orbax's INFO lines (one per directory, save and wait) off the log while checkpoints are written."""
  logger = logging.getLogger("absl")
  level = logger.level
  logger.setLevel(max(level, logging.WARNING))
  try:
    yield
  finally:
    logger.setLevel(level)


@dataclasses.dataclass
class HeadTrainResult:
  """What `train_head` returns: the trained head, the records it logged, and where it exported the head."""

  head: FeatureHead
  logs: list[dict]  # {"step", "loss", "loss_i", "acc_i", "grad_norm", "positions", "steps_per_s"} per log line
  evals: list[dict]  # {"step", "tokens_per_iteration", "alpha", "accepted", "drafted"} per evaluation
  export_dir: str


def head_config(target_config: DecoderOnlyConfig, draft_vocab_size: int) -> eagle3.Eagle3Config:
  """A head of the target's shapes (as SpecForge builds one from the target's config): its hidden size,
  attention heads, MLP width, RoPE and norm epsilon, and the default feature layers (2, L // 2, L - 3) where they
  are distinct; where that default repeats a layer (L = 4 to 6) the features entering layer 1, layer (L + 1) // 2
  and the final pre-norm output instead (aux ids 0, (L + 1) // 2 - 1, L - 1, written to config.json), as
  `t5_head_config` does."""
  c = target_config
  layers = c.num_layers
  aux = None
  if len({2, layers // 2, layers - 3}) < 3 and layers >= 3:
    aux = (0, (layers + 1) // 2 - 1, layers - 1)
  return eagle3.Eagle3Config(aux_layer_ids=aux,
      vocab_size=c.vocab_size, draft_vocab_size=draft_vocab_size, hidden_size=c.hidden_size,
      target_hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_heads=c.num_heads,
      num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, activation=c.activation, rms_norm_eps=c.rms_norm_eps,
      rope=c.rope, max_position_embeddings=c.max_position_embeddings, pad_token_id=c.pad_token_id)


def t5_head_config(target_config: T5Config, draft_vocab_size: int, *, intermediate_size: int | None = None,
                   num_heads: int | None = None, head_dim: int | None = None) -> eagle3.Eagle3Config:
  """A T5 target's head (docs/heads.md, "T5 targets"): hidden size d_model (it embeds with the target's shared
  table), the target's heads and d_kv, an MLP of width d_ff (gated SiLU, as every EAGLE-3 head), RoPE (theta 1e4)
  on its own positions, a cross-attention sublayer over the encoder output (encoder_hidden_size = d_model), and the
  decoder features entering layer 1, layer (L + 1) // 2 and the decoder's final pre-norm output (aux ids 0,
  (L + 1) // 2 - 1, L - 1: low, middle, top, distinct for L >= 3; EAGLE-3's default (2, L // 2, L - 3) repeats a
  layer for the few-layer decoders of T5 drafts-and-targets here).

  intermediate_size, num_heads, head_dim: a head sized for drafting instead of copied from the target (issue 32
  item 4: t5-11b's d_ff 65536 and 128 heads of 128 make a head whose step costs c ~0.077 on an H200; a drafting
  head needs far less width). None: the target's d_ff, num_heads, d_kv."""
  c = target_config
  heads = num_heads or c.num_heads
  layers = c.num_decoder_layers
  return eagle3.Eagle3Config(
      vocab_size=c.vocab_size, draft_vocab_size=draft_vocab_size, hidden_size=c.d_model,
      target_hidden_size=c.d_model, intermediate_size=intermediate_size or c.d_ff, num_heads=heads,
      num_kv_heads=heads, head_dim=head_dim or c.d_kv, activation="silu", rms_norm_eps=c.layer_norm_epsilon, rope=Rope(theta=10000.0),
      max_position_embeddings=2048, aux_layer_ids=(0, max((layers + 1) // 2 - 1, 0), layers - 1),
      pad_token_id=c.pad_token_id, encoder_hidden_size=c.d_model)


def evaluate(target, head: FeatureHead, prompts: Sequence[Sequence[int]], *, gamma: int, max_new_tokens: int,
             batch_size: int, max_input_length: int) -> dict:
  """Greedy speculative decoding of `prompts` with the head drafting: tokens per iteration (tokens per target
  call, 1.0 without speculation) and alpha over every prompt (batches of one size; filler rows left out)."""
  spec = jaxspec.Speculation(head, gamma=gamma)
  parts = []
  for k in range(0, len(prompts), batch_size):
    rows = [list(p) for p in prompts[k:k + batch_size]]
    real = len(rows)
    rows += [rows[-1]] * (batch_size - real)
    out = jaxspec.generate(target, rows, spec, max_new_tokens=max_new_tokens, max_input_length=max_input_length)
    parts.append(out.stats.select(slice(0, real)))
  stats = jaxspec.DecodeStats.concatenate(parts)
  return {"tokens_per_iteration": stats.tokens_per_iteration, "alpha": stats.alpha,
          "accepted": int(stats.accepted.sum()), "drafted": int(stats.drafted.sum())}


def _data(target, prompts, workdir: str, c: HeadTrainConfig, log) -> head_data.HeadData:
  """WORKDIR/data.json, regenerated when absent; ConfigError when it was made from other prompts, settings or
  another target (its config and the first rows of its embedding)."""
  first_rows = np.asarray(jax.device_get(_embedding(target)[:4]), np.float32)
  key = head_data.fingerprint(prompts, max_new_tokens=c.max_new_tokens, temperature=c.temperature, seed=c.seed,
                              target=target.config.to_hf_dict(), embedding=first_rows.round(6).tolist())
  path = os.path.join(workdir, "data.json")
  if os.path.exists(path):
    data = head_data.HeadData.load(path)
    if data.fingerprint != key:
      raise ConfigError(f"{path} was regenerated from other prompts, settings (max_new_tokens, temperature, seed) "
                        f"or another target: use another directory, or remove it to start over.")
    log(f"read {len(data)} regenerated rows from {path}")
    return data
  sampling = jaxspec.Sampling(temperature=c.temperature) if c.temperature > 0 else None
  t0 = time.time()
  data = head_data.regenerate(target, prompts, sampling, max_new_tokens=c.max_new_tokens,
                              batch_size=c.generate_batch_size, max_input_length=c.max_input_length, seed=c.seed,
                              bar=c.progress)
  data.fingerprint = key
  data.save(path)
  tokens = sum(len(r) for r in data.responses())
  log(f"regenerated {len(data)} responses ({tokens} tokens) in {time.time() - t0:.0f} s -> {path}")
  return data


def _embedding(target) -> jax.Array:
  """[V, H] the target's token embedding (the head's, frozen)."""
  return get_path(target.params, target.family.embedding_path)


def _place(target, state: tuple, mesh: Mesh | None) -> tuple:
  """(target, state, place_rows): without a mesh, as they are; on one, the target placed by the default rules
  (unless it already is), every array of `state` (the head's parameters, optimizer state, embedding, vocabulary
  maps) replicated, and place_rows putting a batch's rows over the "data" axis."""
  if mesh is None:
    return target, state, lambda x: x
  if sharding.mesh_of(target.params) is not mesh:
    target = jaxspec.shard(target, mesh)
  replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  return target, jax.tree.map(lambda x: sharding.place(x, replicated), state), lambda x: sharding.place(x, split)


def _saved_meta(manager) -> dict | None:
  """The latest checkpoint's meta (what it was made from), read alone (no arrays); None without checkpoints."""
  if manager.latest_step() is None:
    return None
  return manager.restore(manager.latest_step(), args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta


def _check_same(saved: dict | None, meta: dict, keys: Sequence[str], workdir: str) -> None:
  """ConfigError when the checkpoints' meta differs from this run's in `keys` ("data", "head"), naming the head's
  fields that changed: before anything is restored into arrays of another shape."""
  if saved is None:
    return
  differ = [k for k in keys if saved.get(k) != meta[k]]
  if differ:
    old, new = saved.get("head") or {}, meta["head"]
    fields = [f"{k} {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    raise ConfigError(f"{workdir}/checkpoints belong to a run with other {' and '.join(differ)}"
                      + (f" ({', '.join(fields)})" if "head" in differ and fields else "")
                      + ": use the run's settings, another directory, or remove it to start over.")


def _restore(manager, params, opt_state, meta: dict, mesh: Mesh | None, workdir: str, log) -> tuple:
  """(params, opt_state, step) of the latest checkpoint, restored as `params` and `opt_state` are placed; the
  arguments and step 0 when there is none. ConfigError for checkpoints of other data or another head shape (read
  from the checkpoint's meta before its arrays)."""
  saved = _saved_meta(manager)
  if saved is None:
    return params, opt_state, 0
  _check_same(saved, meta, ("data", "head"), workdir)
  restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
      state=ocp.args.StandardRestore({"params": params, "opt_state": opt_state})))
  changed = {k: (old, meta["settings"][k]) for k, old in (saved.get("settings") or {}).items()
             if meta["settings"].get(k) != old}
  if changed:
    log("settings changed since the checkpoint: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
        + " (the run continues with the new ones: no longer a reproduction of the first run)")
  params, opt_state = restored.state["params"], restored.state["opt_state"]
  if mesh is None:  # Orbax commits them to a device: as fresh arrays instead, the compiled step is reused.
    params, opt_state = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), (params, opt_state))
  log(f"resumed from step {saved['step']}")
  return params, opt_state, int(saved["step"])


def train_head(target, prompts: Sequence[Sequence[int]], workdir: str, config: HeadTrainConfig = HeadTrainConfig(),
               *, heldout_prompts: Sequence[Sequence[int]] = (), mesh: Mesh | None = None,
               on_log: Callable[[dict], None] | None = None, name: str | None = None) -> HeadTrainResult:
  """Trains an EAGLE-3 head for `target` on its responses to `prompts` (the module docstring).

  Args:
    target: a decoder-only or T5 `jaxspec.Model` (its features feed the head; its embedding is the head's,
      frozen; a T5 target's prompts are its encoder inputs).
    prompts: token-id lists; heldout_prompts: token-id lists for the acceptance evaluations (none: no evals).
    workdir: data, checkpoints and the exported head (resumed when it holds a run's checkpoints).
    mesh: None (one device) or a mesh with a "data" axis that divides config.batch_size.
    on_log: called with every log record and evaluation record (dicts, "kind": "train" or "eval"), after the
      step's checkpoint is written: notebooks collect curves with it.
  Returns:
    HeadTrainResult; the head is also in WORKDIR/head.
  Raises:
    ConfigError (bad settings, a target that is neither decoder-only nor T5, a WORKDIR of another run),
    InputError (no or empty prompts), CheckpointError (a decoder-only target with fewer than 3 layers).
  """
  c = config
  encdec = isinstance(target.config, T5Config)
  if not encdec and not isinstance(target.config, DecoderOnlyConfig):
    raise ConfigError(f"training a feature head needs a decoder-only or a T5 target, got "
                      f"{type(target.config).__name__}.")
  vocab = target.config.vocab_size
  c.check(vocab)
  prompts = head_data.check_prompts(prompts, vocab)
  check_run(workdir, c, len(prompts))
  heldout = head_data.check_prompts(heldout_prompts, vocab, "heldout_prompts") if len(heldout_prompts) else []
  if mesh is not None:
    data_size = dict(mesh.shape).get("data", 1)
    if c.batch_size % data_size:
      raise ConfigError(f"batch_size={c.batch_size} is not a multiple of the mesh's data axis ({data_size}).")
  cfg = (t5_head_config if encdec else head_config)(target.config, c.draft_vocab_size)
  layers = eagle3.check_fits(cfg, target.config)
  os.makedirs(workdir, exist_ok=True)
  bar = None

  def log(line: str) -> None:
    if c.verbose:
      (bar.write(line, file=sys.stdout) if bar is not None else print(line))
      sys.stdout.flush()

  if os.path.isdir(os.path.join(workdir, "checkpoints")):  # another head shape: refused before regenerating
    with _quiet_orbax(), contextlib.closing(
        ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")))) as manager:
      _check_same(_saved_meta(manager), {"head": cfg.to_hf_dict()}, ("head",), workdir)
  data = _data(target, prompts, workdir, c, log)
  if len(data) < c.batch_size:
    raise ConfigError(f"batch_size={c.batch_size} exceeds the {len(data)} training rows.")
  d2t, t2d = head_data.draft_vocab(data, vocab, c.draft_vocab_size)
  draft_ids = jnp.asarray(np.flatnonzero(t2d), jnp.int32)
  params = head_steps.init_weights(cfg, c.seed)
  settings = head_steps.HeadStepConfig(head=cfg, ttt_steps=c.ttt_steps, decay=c.ttt_decay,
                                       learning_rate=c.learning_rate, warmup_steps=c.warmup_steps,
                                       total_steps=c.steps if c.cosine else None, weight_decay=c.weight_decay,
                                       clip=c.clip)
  opt_state = head_steps.make_optimizer(settings).init(params)
  maps = {"d2t": jnp.asarray(d2t), "t2d": jnp.asarray(t2d)}
  target, (params, opt_state, embed, maps), place_rows = _place(target, (params, opt_state, _embedding(target),
                                                                         maps), mesh)
  signature = eagle3.target_signature(target)  # recorded in the head's config.json: another target warns
  as_head = lambda p: FeatureHead(cfg, {**p, **maps}, name=name, target=signature)
  meta = {"data": data.fingerprint, "head": cfg.to_hf_dict(),
          "settings": {**{k: getattr(settings, k) for k in settings.__dataclass_fields__ if k != "head"},
                       "batch_size": c.batch_size}}
  quiet = _quiet_orbax()
  quiet.__enter__()
  manager = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")),
                                  options=ocp.CheckpointManagerOptions(max_to_keep=c.keep_checkpoints))
  try:
    params, opt_state, step = _restore(manager, params, opt_state, meta, mesh, workdir, log)
  except BaseException:
    manager.close()
    quiet.__exit__(None, None, None)
    raise

  decoder, width, pad = target.decoder(), data.width, target.config.pad_token_id

  def capture(rows: np.ndarray) -> head_data.HeadBatch:
    """The target's features and labels of the batch of `rows` (placed over the data axis on a mesh)."""
    if encdec:
      enc, dec, lengths = map(place_rows, data.encdec_batch(rows, data.encoder_width, data.decoder_width, pad,
                                                            target.config.decoder_start_token_id))
      return head_data.capture_encdec(decoder, target.params, layers, draft_ids, enc, dec, lengths)
    ids, lengths, starts = map(place_rows, data.batch(rows, width, pad))
    return head_data.capture(decoder, target.params, layers, draft_ids, ids, lengths, starts)

  logs, evals, pending = [], [], []
  eval_kw = dict(gamma=c.eval_gamma, max_new_tokens=c.eval_max_new_tokens, batch_size=c.generate_batch_size,
                 max_input_length=c.max_input_length)

  def run_eval(at: int) -> dict:
    record = {"kind": "eval", "step": at, **evaluate(target, as_head(params), heldout, **eval_kw)}
    evals.append(record)
    log(f"eval step {at}: {record['tokens_per_iteration']:.3f} tokens per target call, alpha {record['alpha']:.3f} "
        f"(gamma {c.eval_gamma}, {len(heldout)} held-out prompts)")
    return record

  shape = f"encoder / decoder width {data.encoder_width} / {data.decoder_width}" if encdec else f"width {width}"
  log(f"training a {'T5 ' if encdec else ''}head: {sum(x.size for x in jax.tree.leaves(params)) / 1e6:.2f}M params, "
      f"draft vocabulary {c.draft_vocab_size} of {vocab}, feature layers {layers}, {len(data)} rows of {shape}, batch "
      f"{c.batch_size}{'' if mesh is None else f' on mesh {dict(mesh.shape)}'}")
  records = []
  if heldout and step == 0:
    records.append(run_eval(0))
  bar = progress_bar(c.steps, "train head", unit="step", initial=step) if c.progress else None
  t_last, last_step = time.time(), step
  try:
    for record in records:
      if on_log is not None:
        on_log(record)
    while step < c.steps:
      rows = head_data.batch_rows(len(data), c.batch_size, step, c.seed)
      batch = capture(rows)
      params, opt_state, metrics = head_steps.train_step(settings, params, opt_state, embed, batch)
      step += 1
      pending.append(metrics)
      if bar is not None:
        bar.update(1)
      records, last = [], step == c.steps
      if step % c.log_every == 0 or last:
        m = jax.device_get(pending)  # Also bounds how far the host runs ahead of the device.
        now = time.time()
        record = {"kind": "train", "step": step, "steps_per_s": (step - last_step) / max(now - t_last, 1e-9),
                  **{k: float(np.mean([x[k] for x in m])) for k in m[0]}}
        t_last, last_step, pending = now, step, []
        logs.append(record)
        records.append(record)
        accs = " ".join(f"{record[f'acc_{i}']:.2f}" for i in range(c.ttt_steps))
        log(f"step {step}/{c.steps} | loss {record['loss']:.4f} | top-1 per draft step {accs} | grad "
            f"{record['grad_norm']:.2f} | {record['steps_per_s']:.2f} steps/s")
      if (c.checkpoint_every and step % c.checkpoint_every == 0) or last:
        manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
            meta=ocp.args.JsonSave({**meta, "step": step})))
      if heldout and ((c.eval_every and step % c.eval_every == 0) or last):
        records.append(run_eval(step))
      if on_log is not None:
        for record in records:
          on_log(record)
  finally:
    manager.wait_until_finished()
    manager.close()
    quiet.__exit__(None, None, None)
    if bar is not None:
      bar.close()
  head = as_head(params)
  export_dir = os.path.join(workdir, "head")
  jaxspec.save(head, export_dir)
  log(f"exported the head to {export_dir}")
  return HeadTrainResult(head=head, logs=logs, evals=evals, export_dir=export_dir)
