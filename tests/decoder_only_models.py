"""Tiny random decoder-only checkpoints written by transformers' `save_pretrained`, one per family variant, with
small BPE tokenizers trained by the `tokenizers` library (with a chat template).

Weights are drawn at a larger scale than transformers' initialisation (and norms away from the identity) so that
logits are far from uniform: greedy comparisons then never hinge on float32 near-ties, and every norm weight,
bias and offset convention matters to the parity tests.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

TOKENIZER_SIZE = 120  # tokens the tokenizer knows (special tokens included)
VOCAB = 128  # embedding rows: the last 8 are padding rows beyond the tokenizer, as in many released models

_SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, max_position_embeddings=256, num_hidden_layers=2)

# name -> (transformers config class, config kwargs, tokenizer adds BOS). Each variant exercises other flags.
VARIANTS = {
    # Llama 2: untied lm_head, plain RoPE.
    "llama2": ("LlamaConfig", dict(_SMALL, tie_word_embeddings=False, rope_theta=10000.0), True),
    # Llama 3.x: tied, "llama3" RoPE scaling over all three frequency bands, attention biases (q, k, v, o).
    "llama3": ("LlamaConfig", dict(_SMALL, tie_word_embeddings=True, attention_bias=True, rope_theta=500000.0,
                                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                     high_freq_factor=4.0, original_max_position_embeddings=64)),
               True),
    # Mistral v0.1: a sliding window on every layer, one K/V head.
    "mistral": ("MistralConfig", dict(_SMALL, num_key_value_heads=1, sliding_window=5, tie_word_embeddings=False),
                True),
    # Qwen2.5: q/k/v biases, tied, linear RoPE scaling.
    "qwen2": ("Qwen2Config", dict(_SMALL, tie_word_embeddings=True, rope_theta=1000000.0,
                                  rope_scaling=dict(rope_type="linear", factor=2.0)), False),
    # Qwen3: per-head q/k RMSNorm, head_dim != hidden / heads, untied.
    "qwen3": ("Qwen3Config", dict(_SMALL, head_dim=16, tie_word_embeddings=False), False),
    # Gemma 2: soft caps small enough to bite, query_pre_attn_scalar != head_dim, alternating windows.
    "gemma2": ("Gemma2Config", dict(_SMALL, num_hidden_layers=3, query_pre_attn_scalar=12, sliding_window=4,
                                    attn_logit_softcapping=3.0, final_logit_softcapping=4.0), True),
    # Gemma 3 (text): q/k norms, local RoPE base for the sliding layers, scaled global RoPE.
    "gemma3": ("Gemma3TextConfig", dict(_SMALL, num_hidden_layers=3, query_pre_attn_scalar=16, sliding_window=4,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                        rope_theta=1000000.0, rope_local_base_freq=100.0,
                                        rope_scaling=dict(rope_type="linear", factor=4.0)), True),
}

# Weight seeds whose greedy outputs do not settle into repeating one token (EOS tests need varied outputs).
SEEDS = {"gemma3": 1}

SPECIALS = ["<pad>", "<s>", "</s>", "<eot>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS, EOT = 0, 1, 2, 3
CHAT_TEMPLATE = ("{% if add_bos %}{{ bos_token }}{% endif %}{% for m in messages %}<|{{ m['role'] }}|>"
                 "{{ m['content'] }}<eot>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
WORDS = ("the a house cat dog river stone green small over under quickly speaks reads writes tree light water "
         "bright morning evening garden window table chair book letter sings runs").split()


def corpus(n: int = 400, seed: int = 0) -> list[str]:
  rng = np.random.RandomState(seed)
  return [" ".join(rng.choice(WORDS, size=rng.randint(3, 9))) + "." for _ in range(n)]


@functools.lru_cache(maxsize=None)
def _tokenizer_json() -> str:
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE(unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_SIZE, special_tokens=SPECIALS, show_progress=False,
                                initial_alphabet=sorted(set("".join(corpus()))))
  tok.train_from_iterator(corpus(), trainer)
  return tok.to_str()


def write_tokenizer(directory: str, add_bos: bool) -> None:
  """A byte-level BPE tokenizer of TOKENIZER_SIZE tokens; `add_bos`: encodes with BOS first (Llama, Gemma) and
  renders BOS in its chat template, or neither (Qwen)."""
  from tokenizers import Tokenizer, processors
  from transformers import PreTrainedTokenizerFast
  tok = Tokenizer.from_str(_tokenizer_json())
  if add_bos:
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", BOS)])
  template = CHAT_TEMPLATE.replace("add_bos", "true" if add_bos else "false")
  hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                               additional_special_tokens=SPECIALS[3:])
  hf.chat_template = template
  assert len(hf) == TOKENIZER_SIZE, len(hf)
  hf.save_pretrained(directory)


def _randomize(model, seed: int, offset: float) -> None:
  """Every parameter redrawn: embeddings N(0, 0.05^2), other matrices N(0, 0.3^2), biases N(0, 0.1^2), norm
  weights (1 - offset) + N(0, 0.1^2). Greedy outputs then vary (larger embeddings make tied models repeat the
  last token)."""
  import torch
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if "norm" in name:
        p.copy_(1.0 - offset + 0.1 * noise)
      elif name.endswith("bias"):
        p.copy_(0.1 * noise)
      elif "embed" in name:
        p.copy_(0.05 * noise)
      else:
        p.copy_(0.3 * noise)


def write_hf_decoder(directory: str, variant: str, seed: int = 0, with_tokenizer: bool = True,
                     generation_eos: list[int] | None = None, **overrides) -> str:
  """Writes a random `*ForCausalLM` of `variant` with save_pretrained (plus its tokenizer); returns the dir."""
  import torch
  import transformers
  class_name, kwargs, add_bos = VARIANTS[variant]
  kwargs = {**kwargs, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, **overrides}
  config = getattr(transformers, class_name)(**kwargs)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  _randomize(model, seed, offset=1.0 if variant.startswith("gemma") else 0.0)
  if config.tie_word_embeddings:
    model.tie_weights()
  model.save_pretrained(directory)
  if generation_eos is not None:
    path = os.path.join(directory, "generation_config.json")
    with open(path) as f:
      gen = json.load(f)
    gen["eos_token_id"] = generation_eos
    with open(path, "w") as f:
      json.dump(gen, f)
  if with_tokenizer:
    write_tokenizer(directory, add_bos)
  return directory


def load_hf_reference(directory: str):
  """transformers' own model from the directory (torch, CPU, float32, eager attention: soft-capping needs it)."""
  import torch
  from transformers import AutoModelForCausalLM
  return AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32).eval()


def ragged_prompts(lengths=(3, 11, 16), seed: int = 0, low: int = len(SPECIALS)) -> list[list[int]]:
  """Prompts of the given lengths (BOS first), ids drawn from the tokenizer's ordinary tokens."""
  rng = np.random.RandomState(seed)
  return [[BOS] + rng.randint(low, TOKENIZER_SIZE, size=n - 1).tolist() for n in lengths]


def checkpoint_dirs(tmp_path_factory) -> dict[str, str]:
  """{variant: directory} of every variant, written once per test session (shared by the test modules)."""
  root = tmp_path_factory.getbasetemp() / "decoder_only"
  dirs = {v: str(root / v) for v in VARIANTS}
  for v, d in dirs.items():
    if not os.path.exists(os.path.join(d, "config.json")):
      write_hf_decoder(d, v, seed=SEEDS.get(v, 0))
  return dirs


def padded(rows: list[list[int]], width: int | None = None, pad: int = PAD) -> np.ndarray:
  """[B, width] int32 right-padded rows."""
  width = width or max(len(r) for r in rows)
  out = np.full((len(rows), width), pad, np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out
