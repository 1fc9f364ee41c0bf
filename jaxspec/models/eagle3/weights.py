"""An EAGLE-3 head's parameters as the reference's files name and lay them out (SpecForge / SafeAILab format), and
the check that a head fits a target. Pure conversions: reading and writing the files is jaxspec/checkpoint/head_dir.py.

    tensors = to_state_dict(config, params)     # {file tensor name: array}, as the reference writes them
    file_tensors(config, names)                 # {file name: (params path, file -> params)} for a file's tensors
    check_fits(config, target_config, params)   # CheckpointError naming every mismatch

Tensor names (PyTorch Linear weights are [out, in]; ours [in, out], attention split per head):

| file                                        | params                          |
|---------------------------------------------|---------------------------------|
| fc.weight [H, 3 Ht]                         | fc [3 Ht, H]                    |
| fc_norm.{0,1,2}.weight [Ht] (if fc_norm)    | fc_norm [3, Ht]                 |
| midlayer.input_layernorm.weight             | input_norm [H]                  |
| midlayer.hidden_norm.weight                 | hidden_norm [H]                 |
| midlayer.self_attn.{q,k,v}_proj.weight      | attention.{q,k,v} [2H, N|K, Hd] |
| midlayer.self_attn.o_proj.weight [H, N Hd]  | attention.o [N, Hd, H]          |
| midlayer.post_attention_layernorm.weight    | mlp_norm [H]                    |
| midlayer.mlp.{gate,up,down}_proj.weight     | mlp.{gate,up,down}              |
| norm.weight                                 | final_norm [H]                  |
| lm_head.weight [Vd, H]                      | lm_head [H, Vd]                 |
| d2t [Vd] int64, t2d [V] bool                | d2t [Vd] int32, t2d [V] bool    |
| embed_tokens.weight [V, H] (optional)       | embedding [V, H]                |

A T5 target's head (architectures ["T5Eagle3Head"], config.json's encoder_hidden_size De; docs/heads.md) has
five more tensors, named as a T5 / Llama layer would name them:

| file                                            | params                              |
|-------------------------------------------------|-------------------------------------|
| midlayer.cross_attention_layernorm.weight [H]   | cross_norm [H]                      |
| midlayer.cross_attn.q_proj.weight [N Hd, H]     | cross_attention.q [H, N, Hd]        |
| midlayer.cross_attn.{k,v}_proj.weight [K Hd, De]| cross_attention.{k,v} [De, K, Hd]   |
| midlayer.cross_attn.o_proj.weight [H, N Hd]     | cross_attention.o [N, Hd, H]        |
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxspec.errors import CheckpointError
from jaxspec.models.eagle3.config import Eagle3Config


def _linear(*shape: int) -> tuple[Callable, Callable]:
  """(file -> params, params -> file) for a Linear weight [out, in] stored as [in, *shape]."""
  return (lambda w: w.T.reshape(shape), lambda p: p.reshape(p.shape[0], -1).T)


def _linear_out(*shape: int) -> tuple[Callable, Callable]:
  """For o_proj: [H, N Hd] in the file, [N, Hd, H] here."""
  return (lambda w: w.T.reshape(shape), lambda p: p.reshape(-1, p.shape[-1]).T)


_SAME = (lambda w: w, lambda p: p)


def _table(cfg: Eagle3Config) -> list[tuple[str, tuple, tuple[Callable, Callable]]]:
  """(file name, params path, (to params, to file)) for every float tensor of the head."""
  h, n, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  rows = [("fc.weight", ("fc",), _linear(cfg.num_features * cfg.target_hidden_size, h)),
          ("midlayer.input_layernorm.weight", ("input_norm",), _SAME),
          ("midlayer.hidden_norm.weight", ("hidden_norm",), _SAME),
          ("midlayer.self_attn.q_proj.weight", ("attention", "q"), _linear(2 * h, n, hd)),
          ("midlayer.self_attn.k_proj.weight", ("attention", "k"), _linear(2 * h, k, hd)),
          ("midlayer.self_attn.v_proj.weight", ("attention", "v"), _linear(2 * h, k, hd)),
          ("midlayer.self_attn.o_proj.weight", ("attention", "o"), _linear_out(n, hd, h)),
          ("midlayer.post_attention_layernorm.weight", ("mlp_norm",), _SAME),
          ("midlayer.mlp.gate_proj.weight", ("mlp", "gate"), _linear(h, cfg.intermediate_size)),
          ("midlayer.mlp.up_proj.weight", ("mlp", "up"), _linear(h, cfg.intermediate_size)),
          ("midlayer.mlp.down_proj.weight", ("mlp", "down"), _linear(cfg.intermediate_size, h)),
          ("norm.weight", ("final_norm",), _SAME),
          ("lm_head.weight", ("lm_head",), _linear(h, cfg.draft_vocab_size))]
  if cfg.cross_attention:
    enc = cfg.encoder_hidden_size
    rows += [("midlayer.cross_attention_layernorm.weight", ("cross_norm",), _SAME),
             ("midlayer.cross_attn.q_proj.weight", ("cross_attention", "q"), _linear(h, n, hd)),
             ("midlayer.cross_attn.k_proj.weight", ("cross_attention", "k"), _linear(enc, k, hd)),
             ("midlayer.cross_attn.v_proj.weight", ("cross_attention", "v"), _linear(enc, k, hd)),
             ("midlayer.cross_attn.o_proj.weight", ("cross_attention", "o"), _linear_out(n, hd, h))]
  return rows


def get(tree: dict, path: tuple) -> Any:
  """tree[path[0]][path[1]]..."""
  for key in path:
    tree = tree[key]
  return tree


def put(tree: dict, path: tuple, value: Any) -> None:
  """Sets tree[path[0]][path[1]]... = value, making the dicts on the way."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def file_tensors(cfg: Eagle3Config, with_embedding: bool) -> dict[str, tuple[tuple, Callable]]:
  """{file tensor name: (params path, file array -> params array)} for every float tensor of a head's file (fc_norm
  rows have the path ("fc_norm", i): stacked into params["fc_norm"] [3, Ht]); d2t / t2d are not in it."""
  out = {name: (dest, fns[0]) for name, dest, fns in _table(cfg)}
  if cfg.fc_norm:
    for i in range(cfg.num_features):
      out[f"fc_norm.{i}.weight"] = (("fc_norm", i), _SAME[0])
  if with_embedding:
    out["embed_tokens.weight"] = (("embedding",), _SAME[0])
  return out


def check_vocab_map(d2t: np.ndarray, t2d: np.ndarray, vocab_size: int, draft_vocab_size: int,
                    where: str = "EAGLE-3 head") -> None:
  """CheckpointError unless d2t [Vd] and t2d [V] describe one draft vocabulary: the target ids d + d2t[d] are
  distinct and in [0, V), and t2d is True exactly at them."""
  d2t, t2d = np.asarray(d2t), np.asarray(t2d)
  if d2t.shape != (draft_vocab_size,) or t2d.shape != (vocab_size,):
    raise CheckpointError(f"{where}: d2t has shape {d2t.shape} and t2d {t2d.shape}; expected ({draft_vocab_size},) "
                          f"(draft_vocab_size) and ({vocab_size},) (vocab_size).")
  ids = np.arange(draft_vocab_size, dtype=np.int64) + d2t.astype(np.int64)
  if ids.min() < 0 or ids.max() >= vocab_size or np.unique(ids).size != ids.size:
    raise CheckpointError(f"{where}: d2t maps the draft vocabulary outside [0, {vocab_size}) or onto a target id "
                          f"twice.")
  expected = np.zeros((vocab_size,), np.bool_)
  expected[ids] = True
  if not np.array_equal(expected, t2d.astype(np.bool_)):
    raise CheckpointError(f"{where}: t2d and d2t disagree at {int(np.sum(expected != t2d.astype(np.bool_)))} target "
                          f"ids (t2d must be True exactly at the ids d + d2t[d]).")


def to_state_dict(cfg: Eagle3Config, params: dict) -> dict[str, np.ndarray]:
  """The tensors of the head's file, named and laid out as the reference writes them."""
  out = {name: np.asarray(fns[1](np.asarray(get(params, dest)))) for name, dest, fns in _table(cfg)}
  if cfg.fc_norm:
    for i in range(cfg.num_features):
      out[f"fc_norm.{i}.weight"] = np.asarray(params["fc_norm"][i])
  if "embedding" in params:
    out["embed_tokens.weight"] = np.asarray(params["embedding"])
  out["d2t"] = np.asarray(params["d2t"]).astype(np.int64)
  out["t2d"] = np.asarray(params["t2d"]).astype(np.bool_)
  return out


TARGET_KEY = "jaxspec_target"  # config.json's record of the target a head was trained on (`target_signature`)
_PROBE = (4, 16)  # embedding rows x leading values kept in a target's signature


def target_signature(target: Any) -> dict:
  """What identifies the target a head is trained on, small enough for config.json: its name, sizes and a probe
  of its token embedding (the first 16 values of rows 0-3, float32). Equal for the same weights in another dtype
  (`same_target` compares with a tolerance); different for a same-shaped model with other weights."""
  from jaxspec.models.hf_table import get_path  # pylint: disable=import-outside-toplevel
  hidden, vocab, layers = _target_sizes(target.config)
  rows, width = _PROBE
  probe = np.asarray(get_path(target.params, target.family.embedding_path)[:rows, :width], np.float32)
  return {"name": target.name, "hidden_size": hidden, "vocab_size": vocab, "num_layers": layers,
          "embedding_probe": np.round(probe, 6).tolist()}


def same_target(signature: dict, target: Any) -> bool:
  """Whether `target` is the one `signature` records: the same sizes and embedding probe (to bfloat16 rounding)."""
  mine = target_signature(target)
  if any(signature.get(k) != mine[k] for k in ("hidden_size", "vocab_size", "num_layers")):
    return False
  try:
    theirs = np.asarray(signature.get("embedding_probe"), np.float32)
  except (TypeError, ValueError):
    return False
  ours = np.asarray(mine["embedding_probe"], np.float32)
  return theirs.shape == ours.shape and bool(np.allclose(theirs, ours, rtol=1e-2, atol=1e-3))


def warn_if_other_target(head: Any, target: Any) -> None:
  """A UserWarning when `head` records a target (`FeatureHead.target`, written by jaxspec's training) and `target`
  is not it: a head drafts from its own target's hidden states, so another target's (even of the same shapes)
  gives drafts it rarely accepts (output stays exact). A head without a record (e.g. SpecForge's) passes."""
  signature = getattr(head, "target", None)
  if not isinstance(signature, dict) or same_target(signature, target):
    return
  import warnings  # pylint: disable=import-outside-toplevel
  warnings.warn(f"head {head.name!r} was trained on another target ({signature.get('name')}), not "
                f"{target.name}: its config.json's {TARGET_KEY} records other sizes or embedding. It still drafts "
                f"exactly, but its drafts will rarely be accepted.", UserWarning, stacklevel=3)


def _is_encoder_decoder(target_config: Any) -> bool:
  """A T5 config (an encoder and a decoder stack) rather than a decoder-only one."""
  return hasattr(target_config, "d_model") and hasattr(target_config, "num_decoder_layers")


def _target_sizes(target_config: Any) -> tuple[int, int, int]:
  """(hidden, vocabulary, decoder layers) of a decoder-only or T5 config."""
  hidden = getattr(target_config, "hidden_size", None) or getattr(target_config, "d_model")
  layers = getattr(target_config, "num_layers") if hasattr(target_config, "hidden_size") else getattr(
      target_config, "num_decoder_layers")
  return int(hidden), int(target_config.vocab_size), int(layers)


def check_fits(cfg: Eagle3Config, target_config: Any, params: dict | None = None) -> tuple[int, ...]:
  """Checks that a head fits a target; returns the target feature layers to ask for (`Eagle3Config.feature_layers`).

  Raises one CheckpointError listing every mismatch: the feature width (target_hidden_size) or the vocabulary
  differs from the target's, the head has no embedding of its own and its hidden size differs from the target's
  (it embeds with the target's table), or an aux layer id is outside the target's layers (id j: the output of
  layer j, 0 <= j < L; without ids the default layers 2, L // 2, L - 3 need L >= 3). With `params`, also d2t / t2d
  present and consistent, and an own embedding of the right shape. A T5 target's head (cfg.cross_attention)
  needs a T5 target whose encoder output is encoder_hidden_size wide.
  """
  hidden, vocab, num_layers = _target_sizes(target_config)
  problems = []
  if cfg.cross_attention:
    if not _is_encoder_decoder(target_config):
      problems.append(f"it is a T5 (encoder-decoder) target's head ({cfg.architecture}: it cross-attends to the "
                      f"target's encoder output), the target is decoder-only ({type(target_config).__name__})")
    elif cfg.encoder_hidden_size != target_config.d_model:
      problems.append(f"it cross-attends to encoder outputs {cfg.encoder_hidden_size} wide (encoder_hidden_size), "
                      f"the target's encoder output is {target_config.d_model} wide (d_model)")
  if cfg.target_hidden_size != hidden:
    problems.append(f"its features are {cfg.target_hidden_size} wide (target_hidden_size), the target's hidden size "
                    f"is {hidden}")
  if cfg.vocab_size != vocab:
    problems.append(f"its vocab_size is {cfg.vocab_size}, the target's {vocab}")
  own_embedding = params is not None and "embedding" in params
  if not own_embedding and cfg.hidden_size != hidden:
    problems.append(f"it has no embedding of its own and its hidden size {cfg.hidden_size} differs from the "
                    f"target's embedding width {hidden}")
  if cfg.aux_layer_ids is not None:
    if len(cfg.aux_layer_ids) != cfg.num_features or any(not 0 <= j < num_layers for j in cfg.aux_layer_ids):
      problems.append(f"its aux layer ids {list(cfg.aux_layer_ids)} must be {cfg.num_features} layer ids in "
                      f"[0, {num_layers}) (the target has {num_layers} layers)")
  elif num_layers < 3:
    problems.append(f"the default feature layers (2, L // 2, L - 3) need a target of at least 3 layers, it has "
                    f"{num_layers}")
  if params is not None:
    if "d2t" not in params or "t2d" not in params:
      problems.append("its parameters lack d2t / t2d (the draft-to-target vocabulary maps)")
    else:
      try:
        check_vocab_map(params["d2t"], params["t2d"], cfg.vocab_size, cfg.draft_vocab_size)
      except CheckpointError as e:
        problems.append(str(e).removeprefix("EAGLE-3 head: ").rstrip("."))
    if own_embedding and tuple(params["embedding"].shape) != (cfg.vocab_size, cfg.hidden_size):
      problems.append(f"its embedding has shape {tuple(params['embedding'].shape)}, expected "
                      f"({cfg.vocab_size}, {cfg.hidden_size})")
  if problems:
    raise CheckpointError("the EAGLE-3 head does not fit this target: " + "; ".join(problems) + ".")
  return cfg.feature_layers(num_layers)
