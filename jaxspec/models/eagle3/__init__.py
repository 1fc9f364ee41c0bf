"""The EAGLE-3 feature head (Li et al. 2025; SpecForge's LlamaForCausalLMEagle3) in JAX.

config.py reads and writes the head's config.json; model.py holds the head (fuse, prefill, step, its KV cache);
weights.py names and lays out the head's tensors as the reference's files do (pure conversions: reading and
writing head directories is jaxspec/checkpoint/head_dir.py) and checks that a head fits a target; cross.py is the
cross-attention sublayer of a T5 (encoder-decoder) target's head. docs/heads.md explains the feature alignment
and how a drafter calls these pieces.
"""

from jaxspec.models.eagle3.config import Eagle3Config
from jaxspec.models.eagle3.cross import EncoderKV, encoder_kv
from jaxspec.models.eagle3.model import (Eagle3Cache, Eagle3Head, HeadInput, attention_inputs, draft_logits, embedding_table,
                                         feed, fuse, init_cache, init_params, layer_output, logits, param_shapes,
                                         prefill, prefill_hidden, step, vocab_maps)
from jaxspec.models.eagle3.weights import (check_fits, check_vocab_map, same_target, target_signature,
                                           to_state_dict, warn_if_other_target)

__all__ = ["Eagle3Cache", "Eagle3Config", "Eagle3Head", "EncoderKV", "HeadInput", "attention_inputs", "check_fits",
           "check_vocab_map", "draft_logits", "embedding_table", "encoder_kv", "feed", "fuse", "init_cache",
           "init_params", "layer_output", "logits", "param_shapes", "prefill", "prefill_hidden", "same_target",
           "step", "target_signature", "to_state_dict", "vocab_maps", "warn_if_other_target"]
