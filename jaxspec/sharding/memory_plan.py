"""`jaxspec.sharding.memory_plan`: bytes per device of a decoding run on a ("data", "model") mesh, before loading anything.

    plan = jaxspec.memory_plan("t5-11b", (1, 8), batch=32, max_input_length=128, max_new_tokens=128, gamma=7,
                               dtype="bfloat16", draft="t5-small")
    print(plan.table()); plan.fits(DEVICE_MEMORY["tpu-v5e"])

Parameters and caches are exact: every array's per-device shape under the logical-axis rules (the draft's under
`DRAFT_RULES`, as `generate` places it), caches from an abstract evaluation of the family's prefill, the batch padded
to a multiple of `data`. Activations are an estimate: the most bytes simultaneously live in one program (prefill,
or a loop iteration: target or draft step plus the sampled distributions), from a liveness pass over the traced
programs at the per-device batch, an intermediate counted per device when one of its non-batch dimensions is a
dimension the weights split over `model`. tests/sharding/test_sharding.py holds it against XLA's `memory_analysis()`.
Nothing is allocated and no device of the planned mesh is needed.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.extend.core as jcore
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh

from jaxspec.checks import check_int
from jaxspec.models import contract, registry
from jaxspec.models.t5 import T5Config
from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec.sharding.rules import DEFAULT_RULES, DRAFT_RULES, is_axes, local_shape, resolve_rules, spec_for

GiB = 2**30
# Memory of one JAX device. TPU v2/v3 show each core as a device (v3-8: 8 devices); v4 and v5p show a chip.
DEVICE_MEMORY = {"tpu-v2": 8 * GiB, "tpu-v3": 16 * GiB, "tpu-v4": 32 * GiB, "tpu-v5e": 16 * GiB,
                 "tpu-v5p": 95 * GiB, "h100-80gb": 80 * 10**9, "a100-40gb": 40 * 10**9, "a100-80gb": 80 * 10**9}
# Named machines: (device kind, number of devices).
MACHINES = {"tpu-v5e-8": ("tpu-v5e", 8), "tpu-v4-8": ("tpu-v4", 4), "tpu-v4-32": ("tpu-v4", 16),
            "tpu-v3-8": ("tpu-v3", 8), "tpu-v2-8": ("tpu-v2", 8), "h100": ("h100-80gb", 1),
            "8xh100": ("h100-80gb", 8)}


@dataclasses.dataclass(frozen=True)
class LoopShape:
  """What a decoding loop holds beyond plain decoding, from its static settings and its drafter (the memory check
  of `generate`, jaxspec.decoding.memory_guard, builds it; `memory_plan`'s public form plans a draft model's
  chain). Hashable: plans are cached."""

  slack: int  # positions per row past max_new_tokens (gamma, or a tree's widest call).
  verify_tokens: int  # positions of the target's verify call: gamma + 1 for a chain, N + 1 for a tree, 1 plain.
  tree: bool = False  # the verify call feeds tree nodes (its [B, T, C] mask is traced).
  sampled_rows: int = 0  # float32 [V] distributions per row live across an iteration (p and q); 0 greedy.
  layers: tuple[int, ...] = ()  # the target features the drafter reads (traced with the verify call).
  drafter_state: int = 0  # bytes per device of the drafter's own state (a head's cache and a T5 head's encoder
  #                         keys / values, the lookup context); a draft model's cache is planned with its model.


@dataclasses.dataclass(frozen=True)
class ModelPlan:
  """One model's bytes per device."""

  role: str  # "target" or "draft".
  params: int
  caches: int
  activations: int  # Its largest program's live intermediates (estimate).
  notes: tuple[str, ...]  # Dimensions replicated because the mesh axis does not divide them.


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes per device of one decoding run; `total` is the peak: weights, caches and loop state, and the larger
  of the prefill's and a loop iteration's activations."""

  mesh_shape: tuple[int, int]  # (data, model)
  batch: int  # Rows after padding to a multiple of data.
  models: tuple[ModelPlan, ...]
  state: int  # The loop's per-row token buffers and counters.
  activations: int

  @property
  def params(self) -> int:
    return sum(m.params for m in self.models)

  @property
  def caches(self) -> int:
    return sum(m.caches for m in self.models)

  @property
  def total(self) -> int:
    return self.params + self.caches + self.state + self.activations

  @property
  def notes(self) -> tuple[str, ...]:
    return tuple(f"{m.role} {n}" for m in self.models for n in m.notes)

  def fits(self, device_bytes: int, headroom: float = 0.9) -> bool:
    """Whether the peak fits `headroom` of a device's memory (the rest: XLA's own buffers, fragmentation)."""
    return self.total <= headroom * device_bytes

  def table(self) -> str:
    """The plan as a small text table, GiB per device."""
    rows = [f"mesh data={self.mesh_shape[0]} x model={self.mesh_shape[1]}, batch {self.batch} (padded), "
            f"GiB per device:", f"  {'':8} {'params':>8} {'caches':>8} {'activ.':>8}"]
    rows += [f"  {m.role:8} {m.params / GiB:8.3f} {m.caches / GiB:8.3f} {m.activations / GiB:8.3f}"
             for m in self.models]
    rows.append(f"  loop state {self.state / GiB:.3f}; peak activations {self.activations / GiB:.3f}; "
                f"total {self.total / GiB:.3f}")
    rows += [f"  note: {n}" for n in self.notes]
    return "\n".join(rows)


def config_of(name_or_config):
  """A config from a config object, a Model or a public T5 shape name ('t5-11b'). Reading a model directory's
  config is the checkpoint layer's: `jaxspec.memory_plan` (jaxspec/checkpoint/plan.py) reads it, then calls this
  module's `memory_plan` with the config."""
  if hasattr(name_or_config, "params") and hasattr(name_or_config, "config"):
    return name_or_config.config
  if not isinstance(name_or_config, str):
    return name_or_config
  if name_or_config in T5_SHAPES:
    return T5Config(**T5_SHAPES[name_or_config])
  raise ValueError(f"memory_plan: {name_or_config!r} is not a public T5 shape name ({', '.join(T5_SHAPES)}): pass "
                   f"a config or a Model, or call jaxspec.memory_plan, which reads a model directory's config.json.")


def _bytes(shape, dtype) -> int:
  try:
    itemsize = np.dtype(dtype).itemsize
  except TypeError:  # PRNG key arrays.
    itemsize = 8
  return math.prod(shape) * itemsize


def _local_bytes(axes_tree, shaped_tree, mesh, rules) -> tuple[int, list[str]]:
  """Sum over a pytree of the per-device bytes of each array, and the notes on replicated dimensions."""
  total, notes = 0, []

  def one(path, axes, x):
    nonlocal total
    spec, why = spec_for(axes, tuple(x.shape), mesh, rules)
    total += _bytes(local_shape(tuple(x.shape), spec, mesh), x.dtype)
    notes.extend(f"{jax.tree_util.keystr(path)}: {w}" for w in why)

  jax.tree_util.tree_map_with_path(one, axes_tree, shaped_tree, is_leaf=is_axes)
  return total, notes


def _peak_live(jaxpr: jcore.Jaxpr, size) -> int:
  """Most bytes of intermediates of `jaxpr` live at once: neither its inputs nor its outputs (the caller counts
  those: parameters, caches, and a nested program's results as its equation's outputs)."""
  last = {}
  for i, eqn in enumerate(jaxpr.eqns):
    for v in eqn.invars:
      if isinstance(v, jcore.Var):
        last[v] = i
  skip = set(jaxpr.invars) | set(jaxpr.constvars) | {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
  live = peak = 0
  for i, eqn in enumerate(jaxpr.eqns):
    inner = max((_peak_live(sub, size) for sub in jcore.jaxprs_in_params(eqn.params)), default=0)
    outs = sum(size(v.aval) for v in eqn.outvars if not isinstance(v, jcore.DropVar) and v not in skip)
    peak = max(peak, live + inner + outs)
    live += sum(size(v.aval) for v in eqn.outvars if v in last and v not in skip)
    live -= sum(size(v.aval) for v in {v for v in eqn.invars if isinstance(v, jcore.Var)}
                if last.get(v) == i and v not in skip)
  return peak


def _split_sizes(family, config, mesh, rules) -> dict[int, int]:
  """{dimension size: devices it is split over} for the dimensions the weights split (over `model`)."""
  sizes, split = dict(mesh.shape), {}
  shapes = jax.tree.leaves(family.param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))
  for axes, shape in zip(jax.tree.leaves(family.param_axes(config), is_leaf=is_axes), shapes):
    spec, _ = spec_for(axes, shape, mesh, rules)
    for size, entry in zip(shape, spec):
      if entry is not None:
        split[size] = math.prod(sizes[a] for a in (entry if isinstance(entry, tuple) else (entry,)))
  return split


def _abstract_params(family, config, dtype):
  """The model's parameters as ShapeDtypeStructs of `dtype` (nothing allocated)."""
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtype), family.param_shapes(config),
                      is_leaf=lambda x: isinstance(x, tuple))


@functools.lru_cache(maxsize=256)
def _traced_prefill(config, dtype, rows: int, width: int, cache_len: int):
  """(jaxpr, (cache, first tokens) shapes) of a model's prefill of `rows` inputs of `width` positions (abstract:
  nothing allocated); cached, as every plan of one model and one length traces the same programs."""
  family = registry.family_of(config)
  params = _abstract_params(family, config, dtype)
  decoder = family.decoder(config)
  ids, lengths = jax.ShapeDtypeStruct((rows, width), jnp.int32), jax.ShapeDtypeStruct((rows,), jnp.int32)

  def call(p, i, n):
    out = decoder.prefill(p, i, n, cache_len)
    return out.cache, out.first

  return jax.make_jaxpr(call, return_shape=True)(params, ids, lengths)


def _cache_shapes(config, dtype, rows: int, width: int, cache_len: int):
  """The caches of `rows` rows (ShapeDtypeStructs): one row's prefill traced once (`_traced_prefill`), each array's
  "batch" axis (the family's cache_axes) then `rows` long (`contract.with_rows`), as the slot engine allocates
  its slots (slot_programs.allocate). A plan of another batch traces no prefill again: tracing a T5-11B's prefill
  took 0.3 s a batch, and `most_that_fit` plans six or seven batches (launch/plan.py --slots)."""
  _, (one, _) = _traced_prefill(config, dtype, 1, width, cache_len)
  leaves, tree = jax.tree_util.tree_flatten(one)
  axes = contract.batch_axes(registry.family_of(config).cache_axes(config))
  return jax.tree_util.tree_unflatten(tree, contract.with_rows(leaves, axes, rows))


@functools.lru_cache(maxsize=256)
def _traced_step(config, dtype, rows: int, width: int, cache_len: int, step_tokens: int, tree: bool,
                 layers: tuple[int, ...]):
  """(jaxpr, (logits, features) shapes) of a model's step of `step_tokens` tokens per row on the caches of
  `_cache_shapes` (a tree's verify call: its [B, T, T] mask too; `layers`: the features read); abstract and
  cached, as the plans of one engine's programs (greedy and sampled, and every tier for a draft model) trace the
  same step."""
  family = registry.family_of(config)
  params = _abstract_params(family, config, dtype)
  decoder = family.decoder(config)
  cache = _cache_shapes(config, dtype, rows, width, cache_len)
  tokens = jax.ShapeDtypeStruct((rows, step_tokens), jnp.int32)
  nodes = None
  if tree:  # the verify call over a tree's nodes: its [B, T, C] mask is one of the call's intermediates
    nodes = contract.TreeNodes(jax.ShapeDtypeStruct((rows, step_tokens), jnp.int32),
                               jax.ShapeDtypeStruct((rows, step_tokens, step_tokens), jnp.bool_))

  def step(p, c, t, n):
    res = decoder.step(p, c, t, tree=n, layers=layers)
    return res.logits, res.features  # the cache is counted as the cache

  return jax.make_jaxpr(step, return_shape=True)(params, cache, tokens, nodes)


def _model_plan(role, config, mesh, rules, batch, width, cache_len, step_tokens, dtype, sampled_rows, tree=False,
                layers=(), prefill_rows=None) -> ModelPlan:
  """Parameters and caches of one model (exact), and its activations (estimate), per device."""
  family = registry.family_of(config)
  params = _abstract_params(family, config, dtype)
  param_bytes, notes = _local_bytes(family.param_axes(config), params, mesh, rules)

  cache = _cache_shapes(config, dtype, batch, width, cache_len)
  cache_bytes, _ = _local_bytes(family.cache_axes(config), cache, mesh, rules)
  # Activations: traced at the per-device batch; an intermediate with a dimension the weights split over `model`
  # (heads, mlp, vocab) is counted split too, its first such dimension after the batch.
  split = _split_sizes(family, config, mesh, rules)

  def size(aval) -> int:
    shape = list(getattr(aval, "shape", ()))
    for d in range(1, len(shape)):
      if shape[d] in split:
        shape[d] //= split[shape[d]]
        break
    return _bytes(shape, getattr(aval, "dtype", np.float32))

  local = batch // dict(mesh.shape).get("data", 1)
  # The prefill's activations: of the per-device batch, or of prefill_rows (a slot engine prefills one request
  # at a time).
  prefill_jaxpr, _ = _traced_prefill(config, dtype, local if prefill_rows is None else prefill_rows, width,
                                     cache_len)
  step_jaxpr, outs = _traced_step(config, dtype, local, width, cache_len, step_tokens, tree, layers)
  # The call's logits [B, T, V] (and features) live through verification; sampled distributions (float32, full
  # vocabulary) across the draft and target calls of an iteration.
  outputs = sum(size(x) for x in jax.tree.leaves(outs)) if role == "target" else 0
  sampled = local * sampled_rows * config.vocab_size * 4
  activations = max(_peak_live(prefill_jaxpr.jaxpr, size),
                    _peak_live(step_jaxpr.jaxpr, size) + outputs + sampled)
  return ModelPlan(role, param_bytes, cache_bytes, activations, tuple(notes))


@functools.lru_cache(maxsize=64)
def _plan(target, draft, mesh_shape, batch, width, max_new_tokens, gamma, dtype, rules, draft_rules,
          sampling, loop: LoopShape | None = None, prefill_rows: int | None = None) -> MemoryPlan:
  mesh = AbstractMesh(tuple(mesh_shape), ("data", "model"))
  data = mesh_shape[0]
  padded = -(-batch // data) * data
  if loop is None:  # the public form: a draft model's chain of gamma, or plain decoding
    gamma = gamma if draft is not None else 0
    rows = (2 * gamma + 1) if sampling else 0  # p [G + 1] and q [G] per row.
    loop = LoopShape(slack=gamma, verify_tokens=gamma + 1, sampled_rows=rows)
  cache_len = max_new_tokens + loop.slack + 1
  models = [_model_plan("target", target, mesh, rules, padded, width, cache_len, loop.verify_tokens, dtype,
                        loop.sampled_rows, loop.tree, loop.layers, prefill_rows)]
  if draft is not None:
    models.append(_model_plan("draft", draft, mesh, draft_rules, padded, width, cache_len, 2, dtype,
                              loop.sampled_rows, prefill_rows=prefill_rows))
  local = padded // data
  # sequences [B, cache_len + 1], per-row counters and keys; the drafter's own state.
  state = local * 4 * (cache_len + 2 + loop.slack + 16) + loop.drafter_state
  return MemoryPlan(mesh_shape=(data, mesh_shape[1]), batch=padded, models=tuple(models), state=state,
                    activations=max(m.activations for m in models))


def memory_plan(config_or_model, mesh_shape, batch: int, max_input_length: int, max_new_tokens: int, gamma: int,
                dtype="bfloat16", draft=None, rules=None, draft_rules=DRAFT_RULES,
                sampling: bool = True, loop: LoopShape | None = None, prefill_rows: int | None = None) -> MemoryPlan:
  """Bytes per device of `generate` on a mesh of `mesh_shape` = (data, model) (or {"data": D, "model": M}).

  Args:
    config_or_model / draft: configs, Models or public T5 shape names ('t5-small' ... 't5-11b'); draft None:
      plain decoding. (`jaxspec.memory_plan` also takes model directories and names: it reads their config.json.)
    batch: rows per generate call; max_input_length: the input bucket (positions of the encoder / prompt).
    rules: the target's logical-axis rules (None: DEFAULT_RULES); draft_rules: the draft's (DRAFT_RULES:
      replicated over `model`, as generate places an unsharded draft).
    sampling: count the sampled distributions' buffers (False: greedy).
    loop: the loop's own shape (`LoopShape`: its slack, verify call, sampled rows, the features and the state of
      its drafter), as `generate`'s memory check passes it for every drafter (a head, prompt lookup, trees); None
      plans a draft model's chain of `gamma` (or plain decoding without a draft).
    prefill_rows: the rows one prefill program runs (None: the batch, as `generate` prefills it; a slot engine
      prefills one request per insert: 1); the caches are the whole batch's either way.
  """
  if isinstance(mesh_shape, dict):
    mesh_shape = (mesh_shape.get("data", 1), mesh_shape.get("model", 1))
  mesh_shape = tuple(int(s) for s in mesh_shape)
  if len(mesh_shape) != 2 or min(mesh_shape) < 1:
    raise ValueError(f"memory_plan: mesh_shape must be (data, model) sizes >= 1, got {mesh_shape}.")
  for name, value in (("batch", batch), ("max_input_length", max_input_length), ("max_new_tokens", max_new_tokens),
                      ("gamma", gamma)):
    check_int(value, f"memory_plan: {name}", 0 if name == "gamma" else 1, error=ValueError)
  dtype = jnp.dtype(dtype)
  target = config_of(config_or_model)
  draft = None if draft is None else config_of(draft)
  return _plan(target, draft, mesh_shape, int(batch), int(max_input_length), int(max_new_tokens), int(gamma),
               dtype, resolve_rules(rules), resolve_rules(draft_rules, DRAFT_RULES), bool(sampling), loop,
               None if prefill_rows is None else int(prefill_rows))


def most_that_fit(need, budget: float, known: int, step: int = 1, limit: int = 2**20) -> int:
  """The most rows n (a multiple of `step`, at most `limit`) whose need(n) is at most `budget`; 0 when not even
  `step` rows fit. need: bytes for n rows, nondecreasing in n (each call traces plans: the fewer, the faster);
  known: a multiple of `step` whose need the caller has (need(known) is asked again: plans are cached).

  A plan's bytes grow by about the same amount per row, so the line through two needs guesses the answer, and
  one more need beside the guess confirms it (n fits, n + step does not). Where a guess misses (a step's gathered
  rows add a jump), the next guess comes from the line between the bounds found, then from their midpoint, in
  turn. Over 20,000 random needs (straight, with jumps, bent either way) it asked for 6.3 on average against 9.7
  for doubling and halving; at worst 7 more, where jumps are large; on straight needs at most 4."""
  values = {}

  def fits(k: int) -> bool:  # k: rows / step
    if k not in values:
      values[k] = need(k * step)
    return values[k] <= budget

  top = max(1, limit // step)
  low, high = 0, None  # fits(low) (0: nothing), not fits(high) (None: not found yet)

  def learn(k: int) -> None:
    nonlocal low, high
    k = max(1, min(k, top))
    if fits(k):
      low = max(low, k)
    else:
      high = k if high is None else min(high, k)

  def crossing(a: int, b: int) -> int | None:  # where the line through the needs at a < b reaches the budget
    if a == b or values[b] <= values[a]:
      return None
    return a + math.floor((budget - values[a]) * (b - a) / (values[b] - values[a]))

  first = max(1, min(known // step, top))
  learn(first)
  learn(first // 2 if first > 1 else 2)
  confirm = True  # a phase's first guess from a line is confirmed beside it; later guesses are not
  while high is None and low < top:  # everything asked fits: extrapolate (or double) past the largest
    a, b = sorted(values)[-2:] if len(values) > 1 else (low, low)
    guess = crossing(a, b)
    learn(2 * low if guess is None or guess <= low else guess)
    if confirm and guess is not None and high is None and low < top:
      learn(low + 1)
    confirm = confirm and guess is None
  if high is None:
    return low * step
  interpolate = confirm = True
  while high - low > 1:
    a, b = (low, high) if low > 0 else sorted(values)[:2] if len(values) > 1 else (high, high)
    guess = crossing(a, b) if interpolate else None  # from below nothing known to fit: the two lowest needs
    guess = (low + high) // 2 if guess is None else min(max(guess, low + 1), high - 1)
    learn(guess)
    if interpolate and confirm and high - low > 1:
      learn(guess + 1 if fits(guess) else guess - 1)
    interpolate, confirm = not interpolate, False
  return low * step


__all__ = ["DEFAULT_RULES", "DEVICE_MEMORY", "MACHINES", "LoopShape", "MemoryPlan", "ModelPlan", "memory_plan",
           "most_that_fit"]
