"""GGUF -> HF conversion: tiny random transformers models written as GGUF the way llama.cpp's converter writes them
(gguf's own HF -> GGUF name map, Q/K permutation for llama, norms + 1 for Gemma 3), converted back and compared
with the source model, with transformers' own GGUF loader, and across split parts."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from jaxspec.checkpoint import CheckpointError  # noqa: E402
from jaxspec.checkpoint.gguf import convert_gguf, hf_tensor_name, join_parts, open_gguf  # noqa: E402

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]


def _vocab() -> list[str]:
  from transformers.convert_slow_tokenizer import bytes_to_unicode
  return list(bytes_to_unicode().values()) + ["Ġt", "he", "Ġthe", "in"] + SPECIALS


def _tiny_model(arch: str, vocab_size: int):
  """A random-weight causal LM (every parameter random, norms and biases included)."""
  import transformers as tf
  common = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)
  if arch == "llama":  # SmolLM2-like: untied output, rope theta 1e5; biases to check their un-permutation too.
    model = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, rope_theta=1e5, attention_bias=True,
                                               tie_word_embeddings=False, **common))
  elif arch == "qwen2":  # Qwen2.5-like: q/k/v biases, tied embeddings, rope theta 1e6.
    model = tf.Qwen2ForCausalLM(tf.Qwen2Config(num_hidden_layers=2, rope_theta=1e6, tie_word_embeddings=True,
                                               **common))
  elif arch == "qwen3":  # Qwen3: q/k norms, head_dim not hidden / heads, no biases.
    model = tf.Qwen3ForCausalLM(tf.Qwen3Config(num_hidden_layers=2, head_dim=16, rope_theta=1e6,
                                               tie_word_embeddings=True, **common))
  else:  # Gemma 3: 7 layers so that layer 5 is global, a 4-token window so that sliding matters.
    model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(num_hidden_layers=7, head_dim=8, query_pre_attn_scalar=8,
                                                     sliding_window=4, rope_theta=1e6, rope_local_base_freq=1e4,
                                                     **common))
  torch.manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.normal_(0.0, 0.3)
  return model.eval()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py)."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(model, arch: str, path: str) -> None:
  """Writes `model` as llama.cpp's convert_hf_to_gguf.py would, all tensors float32."""
  cfg = model.config
  name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
  w = gguf.GGUFWriter(path, arch)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_block_count(cfg.num_hidden_layers)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
  w.add_rope_freq_base(rope["rope_theta"])
  if arch == "llama":
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
  if arch in ("qwen3", "gemma3"):
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
  if arch == "gemma3":
    w.add_sliding_window(cfg.sliding_window)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("qwen2")
  tokens = _vocab()
  w.add_token_list(tokens)
  w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
  w.add_token_merges(MERGES)
  w.add_bos_token_id(tokens.index("<|endoftext|>"))
  w.add_eos_token_id(tokens.index("<|im_end|>"))
  w.add_pad_token_id(tokens.index("<|endoftext|>"))
  w.add_chat_template(TEMPLATE)
  state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  if cfg.tie_word_embeddings:
    state.pop("lm_head.weight", None)
  for name, value in state.items():
    base, suffix = name.rsplit(".", 1)
    if arch == "llama" and base.endswith("q_proj"):
      value = _permute(value, cfg.num_attention_heads)
    if arch == "llama" and base.endswith("k_proj"):
      value = _permute(value, cfg.num_key_value_heads)
    if arch == "gemma3" and name.endswith("norm.weight"):
      value = value + 1.0
    w.add_tensor(f"{name_map.get_name(base)}.{suffix}", np.ascontiguousarray(value, dtype=np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  """{arch: (source model, GGUF path)}."""
  root = tmp_path_factory.mktemp("gguf")
  out = {}
  for arch in ("llama", "qwen2", "qwen3", "gemma3"):
    model = _tiny_model(arch, len(_vocab()))
    path = str(root / f"{arch}.gguf")
    _write_gguf(model, arch, path)
    out[arch] = (model, path)
  return out


def _load(directory):
  from transformers import AutoModelForCausalLM
  return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def _logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_round_trip_matches_source(sources, tmp_path, arch):
  source, path = sources[arch]
  out = convert_gguf(path, str(tmp_path / "hf"))
  model = _load(out)
  assert type(model) is type(source)
  ours, theirs = model.state_dict(), source.state_dict()
  assert set(ours) == set(theirs)
  for name, value in theirs.items():
    # Gemma 3 norms went through 1 + w and back in float32; everything else is bit-exact.
    tol = 1e-6 if arch == "gemma3" and name.endswith("norm.weight") else 0.0
    np.testing.assert_allclose(ours[name].numpy(), value.numpy(), rtol=0, atol=tol, err_msg=name)
  ids = list(np.random.RandomState(1).randint(0, source.config.vocab_size, size=12))
  np.testing.assert_allclose(_logits(model, ids), _logits(source, ids), rtol=1e-5, atol=1e-5)
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "max_position_embeddings", "rms_norm_eps", "vocab_size", "tie_word_embeddings"):
    assert cfg[key] == getattr(source.config, key), key
  rope = source.config.rope_parameters
  assert cfg["rope_theta"] == rope.get("full_attention", rope)["rope_theta"]
  if arch == "gemma3":
    assert cfg["layer_types"] == source.config.layer_types and cfg["sliding_window"] == 4
  with open(os.path.join(out, "generation_config.json")) as f:
    gen = json.load(f)
  vocab = _vocab()  # eos (<|im_end|>) and the other end-of-generation control token llama.cpp knows.
  assert gen["eos_token_id"] == [vocab.index("<|im_end|>"), vocab.index("<|endoftext|>")]


def test_llama_qk_permutation_is_undone(sources):
  """Negative control: the GGUF holds Q/K rows in llama.cpp's order, so a plain rename would be wrong."""
  source, path = sources["llama"]
  raw = {t.name: t.data for t in open_gguf(path).tensors}
  q = source.state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy()
  assert not np.array_equal(raw["blk.0.attn_q.weight"], q)
  assert sorted(raw["blk.0.attn_q.weight"].ravel().tolist()) == sorted(q.ravel().tolist())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_same_weights_as_transformers_gguf_loader(sources, tmp_path, arch):
  """transformers' own GGUF reader (its name map and inverse transforms) on the same file agrees with ours."""
  from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
  _, path = sources[arch]
  model = _load(convert_gguf(path, str(tmp_path / "hf"), tokenizer=False))
  ref = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
  ours = model.state_dict()
  if model.config.tie_word_embeddings:
    ours.pop("lm_head.weight")
  assert set(ours) == set(ref)
  for name in ref:
    np.testing.assert_allclose(ours[name].numpy(), ref[name].numpy(), rtol=0, atol=1e-6, err_msg=name)


def test_tokenizer_and_chat_template(sources, tmp_path):
  from transformers import AutoTokenizer
  _, path = sources["qwen2"]
  out = convert_gguf(path, str(tmp_path / "hf"))
  tok = AutoTokenizer.from_pretrained(out)
  vocab = _vocab()
  ids = tok("the thin<|im_end|>")["input_ids"]
  assert ids == [vocab.index(t) for t in ["t", "he", "Ġt", "h", "in", "<|im_end|>"]]
  assert tok.decode(ids) == "the thin<|im_end|>"
  assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == (
      "<|im_start|>user\nhi<|im_end|>\n")


def _split(path: str, directory: str, n: int) -> list[str]:
  data = open(path, "rb").read()
  os.makedirs(directory)
  cuts = np.linspace(0, len(data), n + 1).astype(int)
  parts = []
  for i in range(n):
    parts.append(os.path.join(directory, f"model.part{i + 1}"))
    with open(parts[-1], "wb") as f:
      f.write(data[cuts[i]:cuts[i + 1]])
  return parts


def _files(directory) -> dict[str, bytes]:
  return {n: open(os.path.join(directory, n), "rb").read() for n in sorted(os.listdir(directory))
          if n.endswith(".safetensors") or n == "config.json"}


def test_parts_join_to_the_same_result(sources, tmp_path):
  _, path = sources["qwen2"]
  parts = _split(path, str(tmp_path / "parts"), 3)
  whole = _files(convert_gguf(path, str(tmp_path / "whole"), tokenizer=False))
  assert _files(convert_gguf(parts, str(tmp_path / "from_list"), tokenizer=False)) == whole
  assert _files(convert_gguf(str(tmp_path / "parts"), str(tmp_path / "from_dir"), tokenizer=False)) == whole
  assert _files(convert_gguf(",".join(parts), str(tmp_path / "from_commas"), tokenizer=False)) == whole


def test_bad_parts_fail_clearly(sources, tmp_path):
  _, path = sources["qwen2"]
  parts = _split(path, str(tmp_path / "parts"), 3)
  with pytest.raises(CheckpointError, match="truncated: tensor"):
    join_parts([parts[0], parts[2]], str(tmp_path / "a.gguf"))  # Missing middle part.
  with open(parts[2], "rb") as f:
    short = f.read()[:-100]
  with open(tmp_path / "short", "wb") as f:
    f.write(short)
  with pytest.raises(CheckpointError, match="truncated: tensor"):
    join_parts([parts[0], parts[1], str(tmp_path / "short")], str(tmp_path / "b.gguf"))
  with pytest.raises(CheckpointError, match="does not start with the GGUF magic"):
    join_parts([parts[1], parts[0], parts[2]], str(tmp_path / "c.gguf"))
  with pytest.raises(CheckpointError, match="after the last tensor"):
    join_parts(parts + [parts[2]], str(tmp_path / "d.gguf"))
  with pytest.raises(CheckpointError, match="its own GGUF header"):
    join_parts([path, path], str(tmp_path / "e.gguf"))
  with pytest.raises(CheckpointError, match="no such GGUF"):
    convert_gguf([parts[0], str(tmp_path / "nope")], str(tmp_path / "hf"))
  assert not os.path.exists(tmp_path / "hf")


def test_sharded_bfloat16_output(sources, tmp_path):
  source, path = sources["llama"]
  out = convert_gguf(path, str(tmp_path / "hf"), dtype="bfloat16", max_shard_bytes=20_000, always_index=True)
  with open(os.path.join(out, "model.safetensors.index.json")) as f:
    index = json.load(f)
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 1 and all(os.path.exists(os.path.join(out, n)) for n in files)
  assert set(index["weight_map"]) == set(source.state_dict())
  model = _load(out)
  for name, value in source.state_dict().items():
    np.testing.assert_array_equal(model.state_dict()[name].numpy(), value.to(torch.bfloat16).float().numpy())


def test_unknown_names_and_architectures_fail():
  assert hf_tensor_name("blk.3.attn_q.bias", "qwen2") == "model.layers.3.self_attn.q_proj.bias"
  assert hf_tensor_name("blk.0.ffn_norm.weight", "gemma3") == "model.layers.0.pre_feedforward_layernorm.weight"
  with pytest.raises(CheckpointError, match="blk.0.attn_qkv.weight"):
    hf_tensor_name("blk.0.attn_qkv.weight", "llama")
  from jaxspec.checkpoint.gguf import hf_config
  with pytest.raises(CheckpointError, match="'falcon' is not supported"):
    hf_config({"general.architecture": "falcon"}, {})
