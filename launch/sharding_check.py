r"""Times `jaxspec.generate` on one device against the same models placed on a mesh (issue 12, item 7).

    python launch/sharding_check.py --output=sharding_check.json                      # 1 x 1 mesh, T5-11B + T5-small
    python launch/sharding_check.py --target=t5-3b --mesh=data:1,model:8 --batch=8    # 8 devices

Random weights of the public T5 shapes (`jaxspec.models.t5.shapes.T5_SHAPES`), bfloat16, random input ids. Contenders,
interleaved round by round (`jaxspec.bench.timing.interleaved_passes`): plain and speculative decoding unsharded and on
the mesh; with several devices also a draft sharded by the default rules next to the replicated draft that
`generate` uses (docs/scaling.md: where the draft goes). Prints ms per token, and whether every contender gave the
unsharded tokens; --output writes the same as JSON.
"""

import json
import platform

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import jaxspec
from jaxspec.models.t5.shapes import T5_SHAPES
from jaxspec import sharding
from jaxspec.bench import timing

_TARGET = flags.DEFINE_enum("target", "t5-11b", sorted(T5_SHAPES), "Target shape.")
_DRAFT = flags.DEFINE_enum("draft", "t5-small", sorted(T5_SHAPES), "Draft shape.")
_MESH = flags.DEFINE_string("mesh", "data:1,model:1", "Mesh 'data:D,model:M' (an axis left out fills the devices).")
_BATCH = flags.DEFINE_integer("batch", 1, "Rows per call.", lower_bound=1)
_INPUT = flags.DEFINE_integer("input_length", 128, "Input tokens per row.", lower_bound=1)
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per row.", lower_bound=1)
_GAMMA = flags.DEFINE_integer("gamma", 7, "Draft tokens per iteration.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds.", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", "", "Write the results here as JSON.")


def _model(shape: str, seed: int) -> jaxspec.Model:
  # EOS out of reach: every row decodes max_new_tokens tokens, so every contender does the same work.
  cfg = jaxspec.T5Config(**T5_SHAPES[shape], eos_token_id=32127)
  return jaxspec.Model.random(cfg, seed, jnp.bfloat16, name=shape)


def main(argv):
  del argv
  sharding.initialize_distributed()
  target, draft = _model(_TARGET.value, 0), _model(_DRAFT.value, 1)
  sizes = sharding.parse_mesh(_MESH.value)
  if len(sizes) == 2:  # Both axes given: the first data x model devices (a 1 x 1 mesh on a machine of several).
    mesh = sharding.make_mesh(**sizes, devices=jax.devices()[:sizes["data"] * sizes["model"]])
  else:
    mesh = sharding.make_mesh(**sizes)
  placed = sharding.shard(target, mesh)
  rows = np.random.RandomState(0).randint(2, 32000, size=(_BATCH.value, _INPUT.value)).astype(np.int32)
  kw = dict(max_new_tokens=_NEW.value, max_input_length=_INPUT.value)
  spec = jaxspec.Speculation(draft, gamma=_GAMMA.value)
  replicated_draft = sharding.shard(draft, mesh, rules=sharding.DRAFT_RULES)  # What generate does (once).
  fns = {"plain": lambda b: jaxspec.generate(target, b, **kw),
         "plain_mesh": lambda b: jaxspec.generate(placed, b, **kw),
         "speculative": lambda b: jaxspec.generate(target, b, spec, **kw),
         "speculative_mesh": lambda b: jaxspec.generate(placed, b, spec.replace(draft=replicated_draft), **kw)}
  if mesh.devices.size > 1:
    sharded = spec.replace(draft=sharding.shard(draft, mesh))
    fns["speculative_mesh_sharded_draft"] = lambda b: jaxspec.generate(placed, b, sharded, **kw)
  passes, _ = timing.interleaved_passes(fns, [rows], _REPEATS.value)
  tokens = {name: p.outputs[0].lengths.sum() for name, p in passes.items()}
  reference = {"plain": passes["plain"].outputs[0].tokens, "speculative": passes["speculative"].outputs[0].tokens}
  result = {"machine": f"{platform.machine()} {jax.devices()[0].device_kind}", "jax": jax.__version__,
            "mesh": dict(mesh.shape), "target": _TARGET.value, "draft": _DRAFT.value, "batch": _BATCH.value,
            "input_length": _INPUT.value, "max_new_tokens": _NEW.value, "gamma": _GAMMA.value,
            "repeats": _REPEATS.value, "contenders": {}}
  for name, p in passes.items():
    same = np.array_equal(p.outputs[0].tokens, reference[name.split("_")[0]])
    result["contenders"][name] = {"ms_per_token": 1e3 * p.median_s / int(tokens[name]), "median_s": p.median_s,
                                  "warmup_s": p.warmup_s, "same_tokens": bool(same)}
    print(f"{name:32s} {1e3 * p.median_s / int(tokens[name]):8.3f} ms/token  same tokens as unsharded: {same}")
  for kind in ("plain", "speculative"):
    ratio = result["contenders"][f"{kind}_mesh"]["median_s"] / result["contenders"][kind]["median_s"]
    result[f"{kind}_mesh_over_unsharded"] = ratio
    print(f"{kind}: mesh / unsharded time = {ratio:.3f}")
  if _OUTPUT.value and sharding.is_main_process():
    with open(_OUTPUT.value, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  app.run(main)
