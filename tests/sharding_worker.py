"""Subprocess side of tests/sharding/test_sharding.py: runs on simulated CPU devices and writes what it saw as JSON.

    python tests/sharding_worker.py tokens OUT.json CONFIGS.json FAMILY[,FAMILY...]  # 8 devices: tokens on 2 meshes
    python tests/sharding_worker.py programs OUT.json                    # 8 devices: HLO, memory, Orbax
    python tests/sharding_worker.py distributed OUT.json TARGET,DRAFT,HEAD PORT ID  # 4 devices, 1 of 2 processes

The device count must be fixed before JAX starts, hence a subprocess per run; compilation dominates, so the XLA
flags of tests/script_helpers.py (`xla_test_flags`, passed as JAXSPEC_TEST_XLA_FLAGS; -O0 without it) trade the
CPU code's speed for compile time.
"""

from __future__ import annotations

import json
import os
import re
import sys

if __name__ == "__main__":  # Before JAX starts; the test module imports the helpers below without this.
  os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={4 if sys.argv[1] == 'distributed' else 8} "
                             + os.environ.get("JAXSPEC_TEST_XLA_FLAGS", "--xla_backend_optimization_level=0 "
                                              "--xla_llvm_disable_expensive_passes=true"))
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxspec  # noqa: E402
from jaxspec import sharding  # noqa: E402
from jaxspec.models import registry  # noqa: E402

MESHES = ((1, 8), (2, 4), (4, 2), (8, 1))


MODES = {"greedy_plain": dict(), "greedy_speculative": dict(draft=True),
         "sampled_speculative": dict(draft=True, sampling=jaxspec.Sampling(temperature=1.0), seed=[11, 12, 13, 14, 15])}
# A family's modes split over its two meshes: each mode decoded on one of them (meshes_of).
MODE_GROUPS = (("greedy_plain", "sampled_speculative"), ("greedy_speculative",))
KW = dict(max_new_tokens=8)
GAMMA = 2
# This family also decodes on a one-device mesh (data=1 x model=1): the sharded path against the unsharded one.
ONE_BY_ONE = ("t5", ("greedy_plain", "sampled_speculative"))


def meshes_of(family: str) -> dict[tuple[int, int], tuple[str, ...]]:
  """{mesh: the MODES decoded there} of a family's two meshes: the families take turns, so every mesh is covered
  by two families and each family by one mesh mostly over `model` (its weights split where their heads, mlp and
  vocab divide) and one mostly over `data` (the batch split); the two families that share two meshes swap
  MODE_GROUPS over them, so every mode is decoded on every mesh (one compile per mode and mesh per family)."""
  names = sorted(f.name for f in registry.families())
  i = names.index(family)
  return {mesh: MODE_GROUPS[(k + i // 2) % 2] for k, mesh in enumerate(MESHES[i % 2::2])}


def _mode(kw: dict, draft) -> dict:
  """A MODES entry as generate's keyword arguments, with `draft` as its speculation's draft."""
  kw = dict(kw)
  return dict(kw, speculation=jaxspec.Speculation(draft, gamma=GAMMA) if kw.pop("draft", False) else None)


def tiny_config_dicts() -> dict:
  """{family name: transformers' own config dict of a tiny model}: a T5 with 3 heads (no model axis divides them)
  and the first decoder-only variant of tests/decoder_only_models.py per family. The test process writes them as
  JSON for the token workers (transformers imports torch: once, not in each worker)."""
  import transformers
  from decoder_only_models import BOS, EOS, PAD, VARIANTS
  # Untied: a tiny random T5 with tied embeddings decodes its start token forever (its logits echo its input).
  dicts = [transformers.T5Config(vocab_size=96, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=3,
                                 relative_attention_num_buckets=8, relative_attention_max_distance=20,
                                 decoder_start_token_id=0, feed_forward_proj="gated-gelu",
                                 tie_word_embeddings=False).to_dict()]
  for cls, kwargs, _ in VARIANTS.values():
    kwargs = {k: v for k, v in kwargs.items() if k != "layer_types"}
    kwargs.update(num_hidden_layers=1, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    dicts.append(getattr(transformers, cls)(**kwargs).to_dict())
  out = {}
  for raw in dicts:
    out.setdefault(registry.family_for_model_type(raw["model_type"]).name, raw)
  return out


def tiny_configs(dicts: dict) -> dict:
  """{family name: its tiny config}, read by each family from `tiny_config_dicts`' (JSON) dicts."""
  return {name: registry.family_for_model_type(raw["model_type"]).from_hf_config(raw) for name, raw in dicts.items()}


def pair(config, seed: int = 0):
  """A random target of `config` and a noisy copy of it as the draft (it accepts often, not always).

  Every weight matrix is rescaled to std 3 / sqrt(fan-in): at their families' initialisation tiny random models
  repeat one token greedily (the residual stream echoes the input embedding), which would make the token
  comparisons weak.
  """
  family = registry.family_of(config)
  params = family.init_params(config, jax.random.key(seed))
  params = jax.tree.map(lambda x: x if x.ndim < 2 or not jnp.std(x) else x / jnp.std(x) * 3 * x.shape[0] ** -0.5,
                        params)  # Vectors (norms, biases) and all-zero arrays (biases [N, H]) stay as they are.
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  noisy = [x + 0.3 * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return jaxspec.Model(config, params), jaxspec.Model(config, jax.tree.unflatten(treedef, noisy))


def prompts(vocab: int) -> list[list[int]]:
  """Five ragged rows (no data axis > 1 divides 5: the batch gets padding rows)."""
  rng = np.random.RandomState(0)
  return [rng.randint(3, vocab, size=n).tolist() for n in (3, 9, 1, 6, 4)]


def record(out) -> dict:
  s = out.stats
  return {"tokens": out.tokens.tolist(), "lengths": out.lengths.tolist(), "iterations": s.iterations.tolist(),
          "accepted": s.accepted.tolist(), "drafted": s.drafted.tolist(), "beta_sum": s.beta_sum.tolist()}


def run_tokens(configs_json: str, families: list[str]) -> dict:
  with open(configs_json) as f:
    configs = tiny_configs(json.load(f))
  result = {}
  for name in families:
    target, draft = pair(configs[name])
    rows = prompts(target.config.vocab_size)
    runs = {}
    for mode, kw in MODES.items():
      runs[mode] = {"reference": record(jaxspec.generate(target, rows, **KW, **_mode(kw, draft)))}
    shapes = dict(meshes_of(name))
    if name == ONE_BY_ONE[0]:
      shapes[(1, 1)] = ONE_BY_ONE[1]
    for shape, modes in shapes.items():
      mesh = sharding.make_mesh(*shape, devices=jax.devices()[:shape[0] * shape[1]])
      placed = sharding.shard(target, mesh)
      # One mesh also takes a draft placed by the default rules; elsewhere generate replicates it.
      placed_draft = sharding.shard(draft, mesh) if shape == (2, 4) else draft
      for mode in modes:
        runs[mode][f"{shape[0]}x{shape[1]}"] = record(jaxspec.generate(placed, rows, **KW,
                                                                       **_mode(MODES[mode], placed_draft)))
    result[name] = runs
  return result


_SHAPE = re.compile(r"=\s*\(?(\w+)\[([\d,]*)\]")


def loop_all_gathers(hlo: str) -> list[tuple[str, int]]:
  """(instruction, elements gathered) of every all-gather traced inside the decoding loop's while body."""
  found = []
  for line in hlo.splitlines():
    if re.search(r"\ball-gather(-start)?\(", line) and "while/body" in line:
      match = _SHAPE.search(line)
      dims = [int(d) for d in match.group(2).split(",") if d] if match else []
      found.append((line.strip()[:160], int(np.prod(dims)) if dims else 1))
  return found


def sharded_weight_sizes(model) -> list[int]:
  """Element counts of the parameters that are split over some mesh axis."""
  return sorted({x.size for x in jax.tree.leaves(model.params) if not x.sharding.is_fully_replicated})


def run_programs() -> dict:
  from jaxspec.sharding.memory_plan import memory_plan
  from jaxspec.models.t5 import T5Config
  # Sizes chosen so that no activation has a weight's element count: 4 heads (split by model=4), d_ff 40.
  cfg = T5Config(vocab_size=104, d_model=24, d_kv=5, d_ff=40, num_layers=1, num_decoder_layers=2, num_heads=4,
                 relative_attention_num_buckets=8, relative_attention_max_distance=20)
  target, draft = pair(cfg)
  rows = prompts(cfg.vocab_size)
  out = {}
  mesh = sharding.make_mesh(2, 4)
  placed = sharding.shard(target, mesh)
  lowered = jaxspec.lower(placed, rows, jaxspec.Speculation(draft, gamma=3), jaxspec.Sampling(temperature=1.0),
                          max_new_tokens=12, max_input_length=16)
  prefill, loop = lowered.prefill.compile(), lowered.loop.compile()
  out["all_gathers"] = loop_all_gathers(loop.as_text())
  out["weight_sizes"] = sharded_weight_sizes(placed)
  out["while_loops"] = loop.as_text().count(" while(")
  # Non-static arguments: target params, draft params, target cache, draft cache, ... Each cache array's logical
  # axes next to the mesh axes the compiled loop takes and gives it.
  axes = jax.tree.leaves(target.family.cache_axes(cfg), is_leaf=sharding.is_axes)

  def specs(shardings):
    return [[list(a), [str(e) if e is not None else None for e in tuple(sh.spec) + (None,) * (len(a) - len(sh.spec))]]
            for a, sh in zip(axes, jax.tree.leaves(shardings))]
  out["cache_in"] = specs(loop.input_shardings[0][2])
  out["cache_out"] = specs(loop.output_shardings.target_cache)
  out["draft_cache_in"] = specs(loop.input_shardings[0][3])
  out["param_specs_in"] = sorted({str(s.spec) for s in jax.tree.leaves(loop.input_shardings[0][0])})
  out["donated"] = loop.as_text().count("input_output_alias") > 0 or "may-alias" in loop.as_text()
  # Negative control: a loop that replicates a sharded weight must show an all-gather of it.
  weight = placed.params["decoder"]["layers"][0]["mlp"]["wi"]

  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def bad(w, x):
    def body(c):
      full = jax.lax.with_sharding_constraint(c[1] * 1.0, replicated)
      return c[0] + 1, c[1], c[2] + jnp.sum(full)
    return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, w, x))[2]
  control = jax.jit(bad).lower(weight, jnp.float32(0)).compile().as_text()
  out["control_all_gathers"] = loop_all_gathers(control)
  out["control_size"] = weight.size
  # The memory plan against XLA's memory analysis of the same programs.
  pm, lm = prefill.memory_analysis(), loop.memory_analysis()
  plan = memory_plan(cfg, (2, 4), len(rows), 16, 12, 3, jnp.float32, draft=cfg)
  out["plan"] = {"params": plan.params, "caches": plan.caches, "state": plan.state,
                 "activations": plan.activations, "total": plan.total, "batch": plan.batch}
  out["xla"] = {"params": int(sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(
      (placed.params, draft.params)))), "loop_alias": lm.alias_size_in_bytes, "loop_out": lm.output_size_in_bytes,
      "loop_temp": lm.temp_size_in_bytes, "prefill_out": pm.output_size_in_bytes,
      "prefill_temp": pm.temp_size_in_bytes}
  # Safetensors read into shards, and Orbax restores, give the arrays `shard` places.
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:
    jaxspec.save(target, os.path.join(tmp, "hf"), format="hf")
    loaded = jaxspec.load(os.path.join(tmp, "hf"), dtype=jnp.float32, mesh=mesh)
    pairs = list(zip(jax.tree.leaves(loaded.params), jax.tree.leaves(placed.params)))
    out["hf_equal"] = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
    out["hf_same_sharding"] = all(a.sharding.is_equivalent_to(b.sharding, a.ndim) for a, b in pairs)
    jaxspec.save(target, os.path.join(tmp, "m"), format="orbax")
    restored = jaxspec.load(os.path.join(tmp, "m"), dtype=jnp.float32, mesh=mesh)
    pairs = list(zip(jax.tree.leaves(restored.params), jax.tree.leaves(placed.params)))
    out["orbax_equal"] = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
    out["orbax_same_sharding"] = all(a.sharding.is_equivalent_to(b.sharding, a.ndim) for a, b in pairs)
  return out


def run_distributed(checkpoints: list[str], port: int, process_id: int) -> dict:
  """One of two processes x 4 devices: loads the target's slices (bytes counted) and decodes on two meshes: greedy
  with a draft model, sampled with a feature head."""
  from jaxspec.checkpoint import hf_dir, io
  from jaxspec.checkpoint.sharded_read import SliceReader
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  sharding.initialize_distributed(f"127.0.0.1:{port}", 2, process_id)
  out = {"process": jax.process_index(), "devices": jax.device_count(), "local": jax.local_device_count()}
  target_dir, draft_dir, head_dir = checkpoints
  family, cfg = io.read_config(target_dir)
  # Loading onto model=8: each process holds half of every split weight and reads only that half.
  mesh = sharding.make_mesh(1, 8)
  reader = SliceReader()
  cfg, params = hf_dir.load_params(target_dir, family, cfg, jnp.float32, mesh=mesh, reader=reader)
  out["bytes_read"] = reader.bytes_read
  out["bytes_total"] = os.path.getsize(os.path.join(target_dir, "model.safetensors"))
  target = jaxspec.Model(cfg, params)
  draft = jaxspec.load(draft_dir, dtype=jnp.float32, mesh=sharding.make_mesh(2, 4))  # The public path.
  rows = prompts(cfg.vocab_size)
  # A draft on another mesh is re-placed on the target's.
  out["greedy"] = jaxspec.generate(target, rows, jaxspec.Speculation(draft, gamma=GAMMA), **KW).tokens.tolist()
  # A feature head beside the target (the public path) on data=2 x model=4: its weights replicated there once,
  # kept with it; sampled, so the processes must draw the same numbers.
  target_2x4 = jaxspec.load(target_dir, dtype=jnp.float32, mesh=sharding.make_mesh(2, 4))
  head = jaxspec.load(head_dir)
  out["head_sampled"] = jaxspec.generate(target_2x4, rows, jaxspec.Speculation(head, gamma=GAMMA),
                                         jaxspec.Sampling(temperature=1.0), seed=[1, 2, 3, 4, 5], **KW).tokens.tolist()
  from jaxspec.decoding import placement  # pylint: disable=import-outside-toplevel
  assert not any(k.startswith("_mesh") for k in vars(head))  # nothing cached on the user's object
  _, _, (given, placed) = placement._COPIES[id(head)]  # pylint: disable=protected-access
  own = {id(x) for x in jax.tree.leaves(head.params)}  # the rest: the target's embedding, kept as placed
  mesh = sharding.mesh_of(target_2x4.params)
  out["head_replicated"] = all(sharding.mesh_of(p) == mesh and (id(g) not in own or p.sharding.is_fully_replicated)
                               for g, p in zip(given, placed))
  out["main"] = sharding.is_main_process()
  return out


if __name__ == "__main__":
  mode, path = sys.argv[1:3]
  if mode == "tokens":
    result = run_tokens(sys.argv[3], sys.argv[4].split(","))
  elif mode == "programs":
    result = run_programs()
  else:
    result = run_distributed(sys.argv[3].split(","), int(sys.argv[4]), int(sys.argv[5]))
  with open(path, "w") as f:
    json.dump(result, f)
