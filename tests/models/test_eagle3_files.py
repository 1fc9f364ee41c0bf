"""Bad EAGLE-3 head directories end in one CheckpointError naming the file and the field or tensor (issue 33, M3,
M4 and the head-file items of "Low"): a config.json field missing or of the wrong type, a truncated
model.safetensors, non-finite or integer weights, a float d2t."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest

from jaxspec.checkpoint.safetensors_io import SafetensorsFile, save_file
from jaxspec.errors import CheckpointError
from jaxspec.checkpoint import head_dir as head_files
from jaxspec.models import eagle3

VOCAB, DRAFT_VOCAB, HIDDEN = 64, 32, 16


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
  cfg = eagle3.Eagle3Config(vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB, hidden_size=HIDDEN,
                            target_hidden_size=HIDDEN, intermediate_size=32, num_heads=2, num_kv_heads=1, head_dim=8,
                            aux_layer_ids=(0, 1, 2))
  out = str(tmp_path_factory.mktemp("head") / "head")
  head_files.save(out, cfg, eagle3.init_params(cfg, jax.random.PRNGKey(0)))
  return out


def _copy_with_config(head_dir: str, out: str, edit) -> str:
  shutil.copytree(head_dir, out)
  path = os.path.join(out, "config.json")
  with open(path) as f:
    raw = json.load(f)
  edit(raw)
  with open(path, "w") as f:
    json.dump(raw, f)
  return out


def _copy_with_tensors(head_dir: str, out: str, edit) -> str:
  shutil.copytree(head_dir, out)
  path = os.path.join(out, "model.safetensors")
  reader = SafetensorsFile(path)
  tensors = {k: np.array(reader.get(k)) for k in reader.keys()}
  edit(tensors)
  save_file(tensors, path)
  return out


CONFIG_CASES = {
    "no_hidden_size": (lambda c: c.pop("hidden_size"), "hidden_size"),
    "hidden_size_text": (lambda c: c.__setitem__("hidden_size", "big"), "hidden_size"),
    "no_vocab_size": (lambda c: c.pop("vocab_size"), "vocab_size"),
    "vocab_size_list": (lambda c: c.__setitem__("vocab_size", [64]), "vocab_size"),
    "no_intermediate_size": (lambda c: c.pop("intermediate_size"), "intermediate_size"),
    "heads_zero": (lambda c: (c.pop("head_dim"), c.__setitem__("num_attention_heads", 0)), "num_attention_heads"),
    "draft_vocab_float": (lambda c: c.__setitem__("draft_vocab_size", 31.5), "draft_vocab_size"),
    "eagle_config_list": (lambda c: c.__setitem__("eagle_config", [0, 1, 2]), "eagle_config"),
    "aux_ids_int": (lambda c: c.__setitem__("eagle_config", {"eagle_aux_hidden_state_layer_ids": 3}),
                    "eagle_aux_hidden_state_layer_ids"),
    "aux_ids_text": (lambda c: c.__setitem__("eagle_config", {"eagle_aux_hidden_state_layer_ids": ["a", 1, 2]}),
                     "eagle_aux_hidden_state_layer_ids"),
    "rms_eps_text": (lambda c: c.__setitem__("rms_norm_eps", "small"), "rms_norm_eps"),
    "config_list": (lambda c: (c.clear(), c.update({"architectures": "LlamaForCausalLMEagle3"})), "architectures"),
}


def test_bad_head_configs_name_the_file_and_field(head_dir, tmp_path):
  """M3: every bad field is one CheckpointError naming config.json and the field (not a KeyError, TypeError,
  ValueError or AttributeError)."""
  for case, (edit, field) in CONFIG_CASES.items():
    directory = _copy_with_config(head_dir, str(tmp_path / case), edit)
    with pytest.raises(CheckpointError) as error:
      head_files.load(directory)
    message = str(error.value)
    assert "config.json" in message and field in message, (case, message)


def test_a_truncated_head_file_says_truncated(head_dir, tmp_path):
  """M4: the reader's own 'truncated file' error, naming the file, not a shape mismatch."""
  out = str(tmp_path / "cut")
  shutil.copytree(head_dir, out)
  path = os.path.join(out, "model.safetensors")
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size // 2)  # cuts a weight tensor, not only the vocabulary maps at the end
  with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated file: tensor"):
    head_files.load(out)


def test_non_finite_integer_and_float_map_tensors_are_refused(head_dir, tmp_path):
  """Low: non-finite or integer weights and a float d2t are one CheckpointError naming file and tensor; a
  NaN check can be skipped (check_finite=False), as for models."""
  def nan(t):
    t["fc.weight"][0, 0] = np.nan
  def inf(t):
    t["lm_head.weight"][1, 2] = np.inf
  cases = {
      "nan": (nan, r"model\.safetensors: tensor 'fc\.weight' holds NaN or infinite values"),
      "inf": (inf, "'lm_head.weight' holds NaN or infinite"),
      "int_weight": (lambda t: t.__setitem__("norm.weight", t["norm.weight"].astype(np.int64)),
                     "'norm.weight' is stored as int64, not a floating-point type"),
      "float_d2t": (lambda t: t.__setitem__("d2t", t["d2t"].astype(np.float32) + 0.5),
                    "'d2t' is stored as float32, not an integer type"),
      "float_t2d": (lambda t: t.__setitem__("t2d", t["t2d"].astype(np.float32)),
                    "'t2d' is stored as float32, not bool"),
  }
  for case, (edit, message) in cases.items():
    with pytest.raises(CheckpointError, match=message):
      head_files.load(_copy_with_tensors(head_dir, str(tmp_path / case), edit))
  cfg, params = head_files.load(str(tmp_path / "nan"), check_finite=False)
  assert np.isnan(np.asarray(params["fc"])).any()


def test_a_head_records_its_target_and_warns_on_another(tmp_path):
  """Low: a head trained by jaxspec records what its target is (shapes and a probe of its embedding) in
  config.json; drafting for a same-shaped other target warns (output stays exact, acceptance would be poor); the
  same target in another dtype does not warn, and a head without a record (SpecForge's) is taken as it is."""
  import warnings
  import jax.numpy as jnp
  import jaxspec
  from jaxspec.decoding.drafters import registry
  from jaxspec.models import decoder_only
  from jaxspec.models.decoder_only.llama import LlamaConfig
  from script_helpers import random_head, random_params
  cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_layers=3, num_heads=2,
                    num_kv_heads=1, head_dim=8, eos_ids=(1,), pad_token_id=0, bos_token_id=None)
  mine, other = (jaxspec.Model(cfg, random_params(decoder_only.param_shapes(cfg), seed), name=f"llama-{seed}")
                 for seed in (0, 1))
  head = random_head(eagle3.Eagle3Config(vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB, hidden_size=HIDDEN,
                                         target_hidden_size=HIDDEN, intermediate_size=32, num_heads=2, num_kv_heads=1,
                                         head_dim=8))
  head = jaxspec.FeatureHead(head.config, head.params, name="mine", target=eagle3.target_signature(mine))
  jaxspec.save(head, str(tmp_path / "head"))
  with open(tmp_path / "head" / "config.json") as f:
    assert json.load(f)["jaxspec_target"]["name"] == "llama-0"
  loaded = jaxspec.load(str(tmp_path / "head"))
  assert loaded.target == head.target
  with pytest.warns(UserWarning, match=r"was trained on another target \(llama-0\), not llama-1"):
    registry.head_drafter(other, loaded)
  bf16 = jaxspec.Model(cfg, jax.tree.map(lambda x: x.astype(jnp.bfloat16), mine.params), name="llama-0 bf16")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    registry.head_drafter(mine, loaded)
    registry.head_drafter(bf16, loaded)
    registry.head_drafter(other, jaxspec.FeatureHead(head.config, head.params))  # no record: nothing to compare
