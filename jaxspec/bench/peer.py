"""The peer in the benchmark: transformers' plain greedy `generate` and assisted generation on the same weights.

Encoder-decoder (T5) and decoder-only pairs. The transformers models are read from the Hugging Face directory a
`jaxspec.Model` was loaded from (config.json + safetensors), or from a copy written by `jaxspec.save(...,
format="hf")` (embedded and Orbax models), always in float32 on torch's CPU. Batch 1, greedy: both models get a
fresh `GenerationConfig` (a directory's defaults, such as a repetition penalty, do not apply); assisted
generation drafts exactly `gamma` tokens per iteration (constant schedule, assistant_confidence_threshold 0).
Same inputs and the same timing as jaxspec's sweep (`jaxspec.bench.timing.interleaved_passes`: a warm-up pass, then
interleaved rounds, medians). Outputs are the new tokens only (EOS included): assisted generation's must equal
transformers' plain greedy output, and that must equal jaxspec's plain greedy output when it is given.
"""

from __future__ import annotations

import os
import tempfile
from typing import Sequence, Union

import jaxspec
from jaxspec.bench import timing
from jaxspec.decoding.theory import expected_tokens_per_iteration

Source = Union[jaxspec.Model, str]  # a loaded model or an HF directory


def hf_source(model: jaxspec.Model) -> Source:
  """The HF directory `model` was loaded from (config.json and safetensors, not a jaxspec Orbax directory), or
  the model itself when it has none (the peer then writes an HF copy). Passing the directory instead of the model
  lets a caller free the JAX parameters before transformers loads its own copy."""
  d = model.name or ""
  if (os.path.isfile(os.path.join(d, "config.json")) and not os.path.exists(os.path.join(d, "jaxspec.json"))
      and any(os.path.exists(os.path.join(d, f)) for f in ("model.safetensors", "model.safetensors.index.json"))):
    return d
  return model


def _load(source: Source, tmp: str, role: str):
  """A torch float32 model of `source` (AutoModelForSeq2SeqLM or AutoModelForCausalLM, by its config)."""
  import torch
  import transformers
  if not isinstance(source, str):
    path = os.path.join(tmp, role)
    jaxspec.save(source, path, format="hf")
    source = path
  config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False)  # Never a checkpoint's code.
  cls = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
  model = cls.from_pretrained(source, dtype=torch.float32, trust_remote_code=False).eval()
  if config.model_type == "t5":
    # transformers' generate sizes T5's KV cache by config.num_layers (the ENCODER depth) and fails when the
    # decoder is deeper; the modules are built already, so raising the number only enlarges that cache.
    model.config.num_layers = max(model.config.num_layers, model.config.num_decoder_layers)
  return model


def _generation_config(model, max_new: int):
  """Plain greedy settings of `model`: its EOS ids (generation_config.json first), pad and decoder start ids."""
  import transformers
  gen, cfg = model.generation_config, model.config
  eos = gen.eos_token_id if gen.eos_token_id is not None else cfg.eos_token_id
  first_eos = eos[0] if isinstance(eos, (list, tuple)) else eos
  pad = next((p for p in (gen.pad_token_id, cfg.pad_token_id) if p is not None), first_eos)
  kw = {"decoder_start_token_id": cfg.decoder_start_token_id} if cfg.is_encoder_decoder else {}
  return transformers.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new, eos_token_id=eos,
                                       pad_token_id=pad, **kw)


def implied_alpha(tokens_per_call: float, gamma: int) -> float:
  """The i.i.d. acceptance rate whose expected tokens per target call (Eq. 1) is tokens_per_call (bisection).

  Iterations cut short by the token budget make it slightly low."""
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if expected_tokens_per_iteration(mid, gamma) < tokens_per_call else (lo, mid)
  return lo


def run_peer(target: Source, draft: Source, ids: Sequence[list[int]], gammas: Sequence[int], repeats: int,
             max_new: int, reference: Sequence[list[int]] | None = None) -> list[dict]:
  """One row per gamma: transformers' plain and assisted ms per token, speedup, latency percentiles, tokens per
  target call and the alpha they imply, and greedy exactness.

  Args:
    target, draft: `jaxspec.Model`s or HF directories (`hf_source`).
    ids: input token ids, one list per input (decoded one at a time).
    reference: jaxspec's plain greedy new tokens per input (EOS included), or None.
  Returns:
    rows with "assisted_identical_to_plain" (every input) and "plain_equals_jaxspec" ([bool per input], None
    without a reference); "plain_mismatches" holds transformers' tokens of the inputs that differ from it.
  """
  import torch
  import transformers
  with tempfile.TemporaryDirectory() as tmp:
    t_hf, d_hf = _load(target, tmp, "target"), _load(draft, tmp, "draft")
  t_hf.generation_config = _generation_config(t_hf, max_new)
  d_hf.generation_config = _generation_config(d_hf, max_new)
  d_hf.generation_config.num_assistant_tokens_schedule = "constant"
  d_hf.generation_config.assistant_confidence_threshold = 0.0
  start = 1 if t_hf.config.is_encoder_decoder else None  # enc-dec outputs begin with the decoder start token
  batches = [torch.tensor([i]) for i in ids]
  calls, current = {}, [None]
  t_hf.register_forward_pre_hook(lambda *_: calls.__setitem__(current[0], calls.get(current[0], 0) + 1))

  def contender(name, assistant_tokens=None):
    def fn(b):
      current[0] = name
      kw = {}
      if assistant_tokens is not None:
        d_hf.generation_config.num_assistant_tokens = assistant_tokens
        kw["assistant_model"] = d_hf
      with torch.no_grad():
        out = t_hf.generate(input_ids=b, attention_mask=torch.ones_like(b), **kw)
      return out[0, b.shape[1] if start is None else start:].tolist()
    return fn

  fns = {"plain": contender("plain"), **{g: contender(g, g) for g in gammas}}
  timed, _ = timing.interleaved_passes(fns, batches, repeats)
  base = timed["plain"]
  plain_out = base.outputs
  plain_tokens = sum(len(o) for o in plain_out)
  equal = None if reference is None else [list(map(int, r)) == o for r, o in zip(reference, plain_out)]
  mismatches = {str(i): o for i, (o, e) in enumerate(zip(plain_out, equal or [])) if not e}
  rows = []
  for g in gammas:
    spec = timed[g]
    tokens = sum(len(o) for o in spec.outputs)
    per_call = tokens * (repeats + 1) / max(calls.get(g, 0), 1)  # every pass decodes the same tokens (greedy)
    plain_ms, spec_ms = 1e3 * base.median_s / plain_tokens, 1e3 * spec.median_s / tokens
    rows.append({"gamma": g, "plain_ms_per_token": plain_ms, "assisted_ms_per_token": spec_ms,
                 "speedup": plain_ms / spec_ms, "tokens_per_target_call": per_call,
                 "implied_alpha": implied_alpha(per_call, g),
                 "plain_latency_s": timing.percentiles(base.latencies_s),
                 "assisted_latency_s": timing.percentiles(spec.latencies_s),
                 "assisted_identical_to_plain": spec.outputs == plain_out, "plain_equals_jaxspec": equal,
                 "plain_mismatches": mismatches, "plain_compile_and_first_pass_s": base.warmup_s,
                 "transformers": transformers.__version__, "torch": torch.__version__,
                 "torch_threads": torch.get_num_threads()})
    print(f"transformers gamma={g}: plain {plain_ms:.2f} assisted {spec_ms:.2f} ms/token ({plain_ms / spec_ms:.2f}x, "
          f"{per_call:.2f} tokens per target call); assisted == plain: {rows[-1]['assisted_identical_to_plain']}; "
          f"plain == jaxspec: {None if equal is None else all(equal)}", flush=True)
  return rows
