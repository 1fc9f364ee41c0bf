"""Decoder-only checkpoints through `jaxspec.load` / `jaxspec.save`: the weight tables' coverage, HF safetensors
(single and sharded), Orbax round trips, export that transformers loads with identical weights and logits,
generation_config.json's EOS ids, tokenizers and chat templates, and errors."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec.models.decoder_only import weights
from jaxspec.tokenizer import NoChatTemplateError

from decoder_only_models import (BOS, VARIANTS, checkpoint_dirs, load_hf_reference, padded, ragged_prompts,
                                 write_hf_decoder)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  return checkpoint_dirs(tmp_path_factory)


def _leaves_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
      x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_table_covers_every_tensor(dirs, variant):
  """The table names every tensor of transformers' model (the lm_head aside when tied), and nothing else."""
  model = jaxspec.load(dirs[variant])
  hf_names = set(load_hf_reference(dirs[variant]).state_dict())
  if model.config.tie_word_embeddings:
    hf_names.discard("lm_head.weight")
  table = weights.weight_table(model.config)
  assert {row.hf_name for row in table} == hf_names and len(table) == len(hf_names)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_loads_in_transformers_with_identical_weights_and_logits(dirs, tmp_path, variant):
  model = jaxspec.load(dirs[variant], dtype=jnp.float32)
  jaxspec.save(model, str(tmp_path / "hf"), format="hf")
  original, exported = load_hf_reference(dirs[variant]), load_hf_reference(str(tmp_path / "hf"))
  want, got = original.state_dict(), exported.state_dict()
  assert set(want) == set(got)
  for name, tensor in want.items():
    assert torch.equal(tensor, got[name]), name
  # The exported config.json means the same architecture to transformers (RoPE scaling, windows, caps...).
  ids = torch.tensor(padded(ragged_prompts((20,), seed=3)), dtype=torch.long)
  with torch.no_grad():
    np.testing.assert_array_equal(exported(input_ids=ids).logits.numpy(), original(input_ids=ids).logits.numpy())
  again = jaxspec.load(str(tmp_path / "hf"))
  assert again.config == model.config and _leaves_equal(again.params, model.params)


@pytest.mark.parametrize("variant", ["llama3", "gemma3"])
def test_orbax_round_trip(dirs, tmp_path, variant):
  model = jaxspec.load(dirs[variant], dtype=jnp.float32)
  jaxspec.save(model, str(tmp_path / "ckpt"), format="orbax")
  again = jaxspec.load(str(tmp_path / "ckpt"), dtype=jnp.float32)
  assert again.config == model.config and type(again.config) is type(model.config)
  assert _leaves_equal(again.params, model.params)
  assert again.tokenizer.same_as(model.tokenizer)
  half = jaxspec.load(str(tmp_path / "ckpt"), dtype=jnp.bfloat16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(half.params))


def test_sharded_safetensors_with_index(dirs, tmp_path):
  from transformers import AutoModelForCausalLM
  single = jaxspec.load(dirs["qwen3"])
  AutoModelForCausalLM.from_pretrained(dirs["qwen3"]).save_pretrained(str(tmp_path / "sharded"),
                                                                      max_shard_size="40KB")
  files = os.listdir(tmp_path / "sharded")
  assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
  sharded = jaxspec.load(str(tmp_path / "sharded"))
  assert sharded.config == single.config and _leaves_equal(sharded.params, single.params)


def test_tied_and_untied_lm_head(dirs, tmp_path):
  """Tying follows the weights: no lm_head (or an exact copy of the embedding) is tied, a distinct one untied."""
  assert jaxspec.load(dirs["llama3"]).config.tie_word_embeddings
  assert not jaxspec.load(dirs["llama2"]).config.tie_word_embeddings
  from safetensors.numpy import load_file, save_file
  copy = str(tmp_path / "copy")
  shutil.copytree(dirs["llama3"], copy)
  tensors = load_file(os.path.join(copy, "model.safetensors"))
  tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
  save_file(tensors, os.path.join(copy, "model.safetensors"), metadata={"format": "pt"})
  assert jaxspec.load(copy).config.tie_word_embeddings


def test_generation_config_eos_ids_and_pad_fallback(tmp_path):
  """Llama 3 style: several EOS ids in generation_config.json (over config.json's one), no pad id (falls back to
  the first EOS); both survive a save."""
  directory = write_hf_decoder(str(tmp_path / "llama3"), "llama3", generation_eos=[2, 3, 7], pad_token_id=None,
                               with_tokenizer=False)
  model = jaxspec.load(directory)
  assert model.config.eos_token_ids == (2, 3, 7) and model.config.pad_token_id == 2
  jaxspec.save(model, str(tmp_path / "saved"), format="hf")
  again = jaxspec.load(str(tmp_path / "saved"))
  assert again.config.eos_token_ids == (2, 3, 7) and again.config.pad_token_id == 2


def _edited(directory, tmp_path, **changes):
  copy = str(tmp_path / f"edited{len(os.listdir(tmp_path))}")
  shutil.copytree(directory, copy)
  with open(os.path.join(copy, "config.json")) as f:
    cfg = json.load(f)
  cfg.update(changes)
  with open(os.path.join(copy, "config.json"), "w") as f:
    json.dump(cfg, f)
  return copy


@pytest.mark.parametrize("changes,message", [
    (dict(model_type="falcon"), "unsupported architecture.*falcon"),
    (dict(model_type="gemma3", text_config={}), "multimodal Gemma 3"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=1e4)), "unsupported rope_type 'yarn'"),
    (dict(num_key_value_heads=3), "not a multiple of num_key_value_heads|num_kv_heads"),
])
def test_bad_configs_are_clear_errors(dirs, tmp_path, changes, message):
  with pytest.raises(jaxspec.CheckpointError, match=message):
    jaxspec.load(_edited(dirs["llama2"], tmp_path, **changes))


def test_config_that_disagrees_with_the_weights(dirs, tmp_path):
  with pytest.raises(jaxspec.CheckpointError, match="q_proj.weight.*has shape"):
    jaxspec.load(_edited(dirs["llama2"], tmp_path, head_dim=4))
  with pytest.raises(jaxspec.CheckpointError, match="does not use.*q_proj.bias"):
    jaxspec.load(_edited(dirs["llama3"], tmp_path, attention_bias=False))


@pytest.mark.parametrize("variant,adds_bos", [("llama2", True), ("qwen2", False)])
def test_tokenizer_encodes_as_transformers(dirs, variant, adds_bos):
  tok = jaxspec.load(dirs[variant]).tokenizer
  hf = tok.hf_tokenizer
  for text in ["the cat reads a book.", "green water under the bright light."]:
    ids = tok.encode(text)
    assert ids == hf(text)["input_ids"] and (ids[0] == BOS) == adds_bos
    assert tok.decode(ids) == text
  assert tok.bos_id == BOS and tok.vocab_size == len(hf)


@pytest.mark.parametrize("variant", ["llama2", "qwen2"])
def test_chat_template_encodes_as_transformers(dirs, variant):
  tok = jaxspec.load(dirs[variant]).tokenizer
  conversations = ["the cat reads a book.",
                   [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a green tree?"},
                    {"role": "assistant", "content": "yes."}, {"role": "user", "content": "and the river"}]]
  for chat in conversations:
    messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else chat
    want = tok.hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
    text = tok.apply_chat_template(chat)
    assert tok.encode(text) == list(want) and list(want).count(BOS) <= 1
    assert text.endswith("<|assistant|>")


def test_chat_template_errors(dirs):
  with pytest.raises(NoChatTemplateError, match="no chat template"):
    jaxspec.load("ende-draft").tokenizer.apply_chat_template("hello")
  tok = jaxspec.load(dirs["llama2"]).tokenizer  # adds BOS to every text...
  tok.hf_tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # ...renders none
  with pytest.raises(ValueError, match="renders no BOS"):
    tok.apply_chat_template("hello")
