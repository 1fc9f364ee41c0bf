"""Loading and saving: HF directories (single, sharded, .bin), Orbax round trips, export to transformers, errors."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec.models.t5 import weights as hf_t5
from jaxspec.checkpoint.safetensors_io import SafetensorsFile, save_file

from conftest import FAMILIES, load_hf_reference


def _leaves_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
      x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_table_covers_every_tensor(hf_dirs, family):
  """Every tensor transformers' model has (tied copies aside) is in the table, and nothing else is."""
  model = jaxspec.load(hf_dirs[family])
  ref = load_hf_reference(hf_dirs[family])
  hf_names = set(ref.state_dict()) - set(hf_t5.TIED_COPIES)
  if model.config.tie_word_embeddings:
    hf_names.discard("lm_head.weight")
  assert {row.hf_name for row in hf_t5.weight_table(model.config)} == hf_names


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_to_transformers_gives_identical_weights(hf_dirs, tmp_path, family):
  model = jaxspec.load(hf_dirs[family], dtype=jnp.float32)
  jaxspec.save(model, str(tmp_path / "hf"), format="hf")
  original = load_hf_reference(hf_dirs[family]).state_dict()
  exported = load_hf_reference(str(tmp_path / "hf")).state_dict()
  assert set(original) == set(exported)
  for name, tensor in original.items():
    assert torch.equal(tensor, exported[name]), name


def test_orbax_round_trip(hf_dirs, tmp_path):
  model = jaxspec.load(hf_dirs["t5_v1_1"], dtype=jnp.float32)
  jaxspec.save(model, str(tmp_path / "ckpt"), format="orbax")
  again = jaxspec.load(str(tmp_path / "ckpt"), dtype=jnp.float32)
  assert again.config == model.config
  assert _leaves_equal(again.params, model.params)
  # Restored straight to another dtype.
  half = jaxspec.load(str(tmp_path / "ckpt"), dtype=jnp.bfloat16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(half.params))
  np.testing.assert_array_equal(np.asarray(half.params["shared"]["embedding"]),
                                np.asarray(model.params["shared"]["embedding"].astype(jnp.bfloat16)))


def test_sharded_safetensors_and_bin(hf_dirs, tmp_path):
  ref = load_hf_reference(hf_dirs["t5_v1_0"])
  base = jaxspec.load(hf_dirs["t5_v1_0"], dtype=jnp.float32)
  ref.save_pretrained(str(tmp_path / "sharded"), max_shard_size="10KB")
  assert os.path.exists(tmp_path / "sharded" / "model.safetensors.index.json")
  assert _leaves_equal(jaxspec.load(str(tmp_path / "sharded"), dtype=jnp.float32).params, base.params)
  # pytorch_model.bin, as older hub checkpoints (t5-11b) ship, with the tied copies and the unused
  # cross-attention bias that original T5 files carry.
  os.makedirs(tmp_path / "bin")
  shutil.copy(os.path.join(hf_dirs["t5_v1_0"], "config.json"), tmp_path / "bin")
  state = {k: v.clone() for k, v in ref.state_dict().items()}
  state["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = torch.zeros(8, 2)
  torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
  assert _leaves_equal(jaxspec.load(str(tmp_path / "bin"), dtype=jnp.float32).params, base.params)


def test_bfloat16_safetensors(hf_dirs, tmp_path):
  model = jaxspec.load(hf_dirs["t5_v1_1"], dtype=jnp.bfloat16)
  jaxspec.save(model, str(tmp_path / "bf16"), format="hf")
  f = SafetensorsFile(str(tmp_path / "bf16" / "model.safetensors"))
  assert f.get("shared.weight").dtype == jnp.bfloat16
  again = jaxspec.load(str(tmp_path / "bf16"), dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(again.params["shared"]["embedding"]),
                                np.asarray(model.params["shared"]["embedding"]).astype(np.float32))
  # The safetensors package reads what our writer wrote.
  from safetensors.numpy import load_file
  f32 = jaxspec.load(hf_dirs["t5_v1_1"], dtype=jnp.float32)
  jaxspec.save(f32, str(tmp_path / "f32"), format="hf")
  theirs = load_file(str(tmp_path / "f32" / "model.safetensors"))
  np.testing.assert_array_equal(theirs["shared.weight"], np.asarray(f32.params["shared"]["embedding"]))


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


def _edit_config(directory, **updates):
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    cfg = json.load(f)
  cfg.update(updates)
  with open(path, "w") as f:
    json.dump(cfg, f)


def _edit_tensors(directory, fn):
  path = os.path.join(directory, "model.safetensors")
  f = SafetensorsFile(path)
  tensors = {k: np.array(f.get(k)) for k in f.keys()}
  fn(tensors)
  save_file(tensors, path, metadata={"format": "pt"})


def test_missing_weight_names_file_and_tensor(hf_dirs, tmp_path):
  d = _copy(hf_dirs["t5_v1_0"], tmp_path / "m")
  name = "decoder.block.1.layer.2.DenseReluDense.wo.weight"
  _edit_tensors(d, lambda t: t.pop(name))
  with pytest.raises(jaxspec.CheckpointError, match=name.replace(".", r"\.")):
    jaxspec.load(d)


def test_shape_mismatch_names_file_and_tensor(hf_dirs, tmp_path):
  d = _copy(hf_dirs["t5_v1_0"], tmp_path / "s")
  _edit_config(d, d_ff=48)
  with pytest.raises(jaxspec.CheckpointError, match=r"model\.safetensors.*DenseReluDense\.wi\.weight.*shape"):
    jaxspec.load(d)


def test_unknown_architecture(hf_dirs, tmp_path):
  d = _copy(hf_dirs["t5_v1_0"], tmp_path / "a")
  _edit_config(d, model_type="bert", architectures=["BertModel"])
  with pytest.raises(jaxspec.CheckpointError, match=r"config\.json.*unsupported architecture.*bert"):
    jaxspec.load(d)


def test_truncated_safetensors_names_file_and_tensor(hf_dirs, tmp_path):
  d = _copy(hf_dirs["t5_v1_0"], tmp_path / "t")
  path = os.path.join(d, "model.safetensors")
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size - 100)
  f = SafetensorsFile(path)
  last = max(f.keys(), key=lambda k: f._header[k]["data_offsets"][1])
  with pytest.raises(jaxspec.CheckpointError, match=rf"model\.safetensors: truncated file: tensor '{last}'"):
    jaxspec.load(d)
  with open(path, "r+b") as f:
    f.truncate(5)
  with pytest.raises(jaxspec.CheckpointError, match=r"model\.safetensors: not a safetensors file"):
    jaxspec.load(d)


def test_missing_files_and_unknown_names(hf_dirs, tmp_path):
  with pytest.raises(jaxspec.CheckpointError, match="Unknown model 'no-such-model'"):
    jaxspec.load("no-such-model")
  d = _copy(hf_dirs["t5_v1_0"], tmp_path / "w")
  os.remove(os.path.join(d, "model.safetensors"))
  with pytest.raises(jaxspec.CheckpointError, match="no weights"):
    jaxspec.load(d)
  os.remove(os.path.join(d, "config.json"))
  with pytest.raises(jaxspec.CheckpointError, match="no config.json"):
    jaxspec.load(d)


def test_unused_tensor_is_an_error(hf_dirs, tmp_path):
  d = _copy(hf_dirs["t5_v1_0"], tmp_path / "u")
  _edit_tensors(d, lambda t: t.update({"encoder.block.7.layer.0.layer_norm.weight": np.ones(16, np.float32)}))
  with pytest.raises(jaxspec.CheckpointError, match=r"encoder\.block\.7"):
    jaxspec.load(d)


def test_tokenizer_loads_from_the_model_directory(hf_dirs, tmp_path):
  import sentencepiece as spm
  from jaxspec.tokenizer import write_sentencepiece_tokenizer
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(["the house is small", "das haus ist klein", "a small house",
                               "hello world", "translate English to German"] * 20))
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=40,
                                 pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type="unigram",
                                 hard_vocab_limit=False, minloglevel=2)
  d = _copy(hf_dirs["t5_v1_0"], tmp_path / "tok")
  write_sentencepiece_tokenizer(str(tmp_path / "sp.model"), d)
  model = jaxspec.load(d)
  ids = model.tokenizer.encode("the house is small")
  assert ids[-1] == 1 and model.tokenizer.decode(ids) == "the house is small"
  jaxspec.save(model, str(tmp_path / "orbax"))
  reloaded = jaxspec.load(str(tmp_path / "orbax")).tokenizer
  assert reloaded.encode("the house is small") == ids
  assert reloaded.same_as(model.tokenizer)  # distinct objects, same token -> id map
  # Another sentencepiece model maps pieces to other ids: not the same tokenizer.
  corpus.write_text("\n".join(["zebra quartz jumps", "kleine zebras springen", "quiet wizards"] * 20))
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp2"), vocab_size=40,
                                 pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type="unigram",
                                 hard_vocab_limit=False, minloglevel=2)
  d2 = _copy(hf_dirs["t5_v1_0"], tmp_path / "tok2")
  write_sentencepiece_tokenizer(str(tmp_path / "sp2.model"), d2)
  other = jaxspec.load(d2).tokenizer
  assert not other.same_as(model.tokenizer) and not model.tokenizer.same_as(other)
