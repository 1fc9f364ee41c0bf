"""Training a T5 target's feature head (jaxspec.training.head with a T5 target; docs/heads.md, "T5 targets"): the
loss falls and held-out acceptance rises on a tiny T5 pair, the export loads back and drafts exactly, and the
training-time unroll with cross-attention is what the drafter computes.

The tiny target: a random T5 (1 encoder layer, 3 decoder layers, untied lm_head) whose decoder layers write little
through self-attention and the MLP but read the source through a full-strength cross-attention, so its next token
depends on the current one and on the source. Weights drawn with numpy (N(0, 1) scaled as T5 initialises them):
jax.random would compile a program per shape.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.models import eagle3, t5
from jaxspec.training import head_data, head_steps
from jaxspec.training.head import HeadTrainConfig, t5_head_config, train_head

V = 16


@functools.lru_cache(maxsize=None)
def tiny_t5(mix: float = 0.1) -> jaxspec.Model:
  cfg = t5.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=3, num_heads=4,
                    tie_word_embeddings=False, scale_decoder_outputs=False, eos_token_id=1, pad_token_id=0,
                    decoder_start_token_id=0)
  rng = np.random.default_rng(0)
  std = {"q": (32 * 8) ** -0.5, "o": 32 ** -0.5, "wo": 64 ** -0.5}

  def draw(path, shape):
    name = path[-1].key
    if name.endswith("norm"):
      return np.ones(shape, np.float32)
    scale = 1.0 if name in ("embedding", "lm_head") else std.get(name, 32 ** -0.5)
    return (rng.normal(size=shape) * scale).astype(np.float32)

  p = jax.tree_util.tree_map_with_path(draw, t5.param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
  for layer in p["decoder"]["layers"]:
    layer["self_attention"]["o"] *= mix
    layer["mlp"]["wo"] *= mix
  return jaxspec.Model(cfg, jax.tree.map(jnp.asarray, p), name="tiny-t5")


def prompts(n: int, seed: int) -> list[list[int]]:
  rng = np.random.RandomState(seed)
  return [rng.randint(2, V, size=rng.randint(2, 8)).tolist() for _ in range(n)]


def config(**overrides) -> HeadTrainConfig:
  kw = dict(steps=60, batch_size=8, learning_rate=3e-3, draft_vocab_size=12, ttt_steps=3, max_new_tokens=16,
            max_input_length=16, generate_batch_size=8, eval_every=0, eval_max_new_tokens=16, checkpoint_every=0,
            log_every=10, progress=False, verbose=False)
  return HeadTrainConfig(**{**kw, **overrides})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """60 steps on 48 prompts, evaluated on 8 held-out prompts at steps 0 and 60."""
  workdir = str(tmp_path_factory.mktemp("t5_head_run"))
  result = train_head(tiny_t5(), prompts(48, 0), workdir, config(), heldout_prompts=prompts(8, 1),
                      name="tiny-t5-head")
  return result, workdir


def test_training_lowers_the_loss_and_raises_acceptance(run):
  result, _ = run
  assert result.head.config.cross_attention and result.head.config == t5_head_config(tiny_t5().config, 12)
  losses = [r["loss"] for r in result.logs]
  assert losses[-1] < losses[0] - 0.3, losses
  assert result.logs[-1]["acc_0"] > result.logs[0]["acc_0"] + 0.1
  untrained, trained = result.evals[0], result.evals[-1]
  assert trained["tokens_per_iteration"] > untrained["tokens_per_iteration"] + 0.15, result.evals
  assert trained["alpha"] > untrained["alpha"] + 0.1


def test_the_export_loads_and_drafts_exactly(run):
  """The rows are the prompts (encoder inputs) and the responses; jaxspec.load reads the export back as the same
  T5 head, whose greedy speculative output equals plain decoding."""
  result, workdir = run
  data = head_data.HeadData.load(f"{workdir}/data.json")
  assert [t[:n].tolist() for t, n in zip(data.tokens, data.prompt_lengths)] == prompts(48, 0)
  loaded = jaxspec.load(result.export_dir)
  assert loaded.config == result.head.config and "embedding" not in loaded.params
  target, held = tiny_t5(), prompts(8, 1)
  plain = jaxspec.generate(target, held, max_new_tokens=16, max_input_length=16)
  spec = jaxspec.generate(target, held, jaxspec.Speculation(loaded, gamma=3), max_new_tokens=16,
                          max_input_length=16)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  assert spec.stats.tokens_per_iteration == pytest.approx(result.evals[-1]["tokens_per_iteration"])


def test_an_encoder_decoder_batch_splits_prompt_and_response():
  data = head_data.HeadData([np.array([9, 8, 7, 3, 4, 1]), np.array([5, 2, 1])], [3, 2])
  assert data.encoder_width == 8 and data.decoder_width == 8
  enc, dec, lengths = data.encdec_batch([1, 0], 8, 8, pad_id=0, start_id=0)
  assert enc.tolist() == [[5, 2, 0, 0, 0, 0, 0, 0], [9, 8, 7, 0, 0, 0, 0, 0]]
  assert dec.tolist() == [[0, 1, 0, 0, 0, 0, 0, 0], [0, 3, 4, 1, 0, 0, 0, 0]]
  assert lengths.tolist() == [2, 4]


def test_the_unroll_with_cross_attention_is_the_drafter_chain():
  """Step i of the training-time test at index t equals what a T5 head computes at inference after a prefill of
  entries 0..t and i chain steps, with the same encoder keys and values in its cache."""
  cfg = eagle3.Eagle3Config(vocab_size=16, draft_vocab_size=12, hidden_size=32, target_hidden_size=32,
                            intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, encoder_hidden_size=24)
  params = head_steps.init_weights(cfg, 0, std=0.3)
  rng = np.random.RandomState(0)
  batch, width, steps = 2, 10, 3
  embed = jnp.asarray(rng.randn(16, 32), jnp.float32)
  features = jnp.asarray(rng.randn(batch, width, 96), jnp.float32)
  tokens = jnp.asarray(rng.randint(0, 16, (batch, width)), jnp.int32)
  encoded = jnp.asarray(rng.randn(batch, 5, 24), jnp.float32)
  mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  head, ts = eagle3.Eagle3Head(cfg), (0, 3, width - steps - 1)

  @jax.jit
  def both():
    kv = eagle3.encoder_kv(params, cfg, encoded, mask)
    logits, out = head_steps.unroll(params, cfg, embed, features, tokens, steps, kv)
    full, prenorm = eagle3.prefill_hidden(params, cfg, embed, features, tokens, jnp.full((batch,), width), 4,
                                          encoder=kv)
    chains = []
    for t in ts:
      cache = full.replace(lengths=jnp.full((batch,), t + 1, jnp.int32))
      hidden, chain = prenorm[:, t], [prenorm[:, t]]
      for i in range(1, steps):
        pre, cache = eagle3.feed(params, cfg, embed, cache, hidden[:, None], tokens[:, t + 1 + i][:, None])
        hidden = pre[:, 0]
        chain.append(hidden)
      chains.append(jnp.stack(chain))
    no_cross = head_steps.unroll(params, cfg, embed, features, tokens, steps,
                                 eagle3.EncoderKV(k=kv.k * 0, v=kv.v * 0, mask=kv.mask))[1]
    return out, chains, no_cross

  out, chains, no_cross = both()
  for t, chain in zip(ts, chains):
    np.testing.assert_allclose(out[:, :, t], chain, atol=1e-4)
  assert not np.allclose(out, no_cross, atol=1e-2)  # the encoder reaches the outputs: the check can fail
