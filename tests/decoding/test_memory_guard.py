"""generate's memory check (jaxspec.decoding.memory_guard) counts what every drafter adds to the loop (issue 33 M1):
a feature head (its cache; a T5 head's encoder keys and values), prompt lookup (its context), token trees (the
[B, N + 1, V] logits and the [B, N, C] mask of the verify call), chains (the [B, gamma + 1, V] logits) and the
sampled distributions. A call that does not fit is refused with the one-line CacheTooLargeError before anything is
placed or allocated, whatever drafts; plain decoding of the same call fits the same budget (so the refusal comes
from what the drafter adds). The estimate stays within a stated factor of XLA's `memory_analysis()` of the loop.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding import generation, memory_guard, placement
from jaxspec.decoding.drafters import registry
from jaxspec.models import decoder_only as do
from jaxspec.models import eagle3, t5
from jaxspec.models.decoder_only.llama import LlamaConfig
from jaxspec.sharding import memory_plan

V, H = 512, 32  # a vocabulary large enough that the loop's [B, T, V] buffers matter
PROMPTS = [[5, 6, 7, 8, 5, 6, 1], [9, 10, 11, 1]]
NEW = 96


@functools.lru_cache(maxsize=None)
def _models():
  """(llama target, its head, T5 target, its cross head, a T5 draft), random weights (shapes are what count)."""
  llama = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                      head_dim=8, eos_ids=(1,), pad_token_id=0, bos_token_id=None)
  target = jaxspec.Model(llama, do.init_params(llama, jax.random.PRNGKey(0)), name="tiny-llama")
  hcfg = eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=128, hidden_size=H, target_hidden_size=H,
                             intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 1, 2))
  head = jaxspec.FeatureHead(hcfg, eagle3.init_params(hcfg, jax.random.PRNGKey(1)), name="tiny-head")
  tcfg = t5.T5Config(vocab_size=V, d_model=H, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=3, num_heads=4,
                     eos_token_id=1, pad_token_id=0, decoder_start_token_id=0)
  t5_target = jaxspec.Model(tcfg, t5.init_params(tcfg, jax.random.PRNGKey(2)), name="tiny-t5")
  dcfg = t5.T5Config(vocab_size=V, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                     eos_token_id=1, pad_token_id=0, decoder_start_token_id=0)
  t5_draft = jaxspec.Model(dcfg, t5.init_params(dcfg, jax.random.PRNGKey(3)), name="tiny-t5-draft")
  ccfg = eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=128, hidden_size=H, target_hidden_size=H,
                             intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 1, 2),
                             encoder_hidden_size=H)
  t5_head = jaxspec.FeatureHead(ccfg, eagle3.init_params(ccfg, jax.random.PRNGKey(4)), name="tiny-t5-head")
  return target, head, t5_target, t5_head, t5_draft


CASES = ["head", "head tree", "lookup", "lookup tree", "T5 head", "draft-model tree", "draft-model chain"]


@functools.lru_cache(maxsize=None)
def _cases():
  """{name: (target, speculation, sampling)} of CASES (built on first use, not at collection: the models' random
  weights compile)."""
  target, head, t5_target, t5_head, t5_draft = _models()
  greedy, sampled = jaxspec.Sampling(), jaxspec.Sampling(1.0)
  return {
      "head": (target, jaxspec.Speculation(head, gamma=4), greedy),
      "head tree": (target, jaxspec.Speculation(head, gamma=4, tree=jaxspec.Tree(4, 12)), greedy),
      "lookup": (target, jaxspec.Speculation(jaxspec.NGramDraft(), gamma=4), sampled),
      "lookup tree": (target, jaxspec.Speculation(jaxspec.NGramDraft(), gamma=4, tree=jaxspec.Tree(3, 12)), greedy),
      "T5 head": (t5_target, jaxspec.Speculation(t5_head, gamma=4), greedy),
      "draft-model tree": (t5_target, jaxspec.Speculation(t5_draft, gamma=4, tree=jaxspec.Tree(4, 12)), sampled),
      "draft-model chain": (t5_target, jaxspec.Speculation(t5_draft, gamma=4), sampled),
  }


def _plan(monkeypatch, target, speculation, sampling):
  """The plan generate's check builds (bytes per device), with a budget it always fits."""
  seen = []
  real = memory_guard.memory_plan
  monkeypatch.setattr(memory_guard, "memory_plan", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
  monkeypatch.setattr(memory_guard, "_least_free", lambda where: 2**40)
  generation._placed(generation._prepare(target, PROMPTS, speculation, sampling, NEW, 64, False), target, 0)
  monkeypatch.setattr(memory_guard, "memory_plan", real)
  return seen[-1]


def _need(monkeypatch, target, speculation, sampling) -> int:
  plan = _plan(monkeypatch, target, speculation, sampling)
  return plan.caches + plan.state + plan.activations


@pytest.mark.parametrize("name", CASES)
def test_what_a_drafter_adds_is_counted_and_refused_before_allocating(monkeypatch, name):
  assert list(_cases()) == CASES  # every case is a test
  target, speculation, sampling = _cases()[name]
  plain_plan, plan = _plan(monkeypatch, target, None, sampling), _plan(monkeypatch, target, speculation, sampling)
  plain, need = (p.caches + p.state + p.activations for p in (plain_plan, plan))
  source = registry.draft_source(target, speculation)
  draft_params = None if isinstance(speculation.draft, jaxspec.Model) else source.params
  settings = generation._prepare(target, PROMPTS, speculation, sampling, NEW, 64, False).settings
  state = memory_guard.loop_shape(settings, target.params, draft_params, isinstance(speculation.draft, jaxspec.Model),
                                  len(PROMPTS), 16).drafter_state
  # The drafter's own state in the loop's state, and the verify call's logits [B, T, V] float32 (T = gamma + 1, or
  # a tree's N + 1 nodes) among the activations.
  tokens = (speculation.tree.nodes if speculation.tree is not None else speculation.gamma) + 1
  assert plan.state - plain_plan.state >= state, (name, plan.state, plain_plan.state, state)
  assert plan.activations >= len(PROMPTS) * tokens * V * 4, (name, plan.activations)
  assert need > plain
  if not isinstance(speculation.draft, jaxspec.Model):
    assert state > 0  # a head's cache (and a T5 head's encoder keys / values), the lookup context

  budget = (plain + need) / 2 / 0.9  # plain decoding fits it, the speculative call does not
  monkeypatch.setattr(memory_guard, "_least_free", lambda where: int(budget))
  moved = []
  monkeypatch.setattr(placement, "prepare", lambda *a, **k: moved.append(1))
  with pytest.raises(jaxspec.CacheTooLargeError, match=r"^the decoding caches and activations need [\d.]+ GiB per "
                                                       r"device .* free: lower max_new_tokens"):
    jaxspec.generate(target, PROMPTS, speculation, sampling, max_new_tokens=NEW, max_input_length=64)
  assert not moved  # refused before anything was placed
  generation._placed(generation._prepare(target, PROMPTS, None, sampling, NEW, 64, False), target, 0)  # plain fits
  assert moved == [1]


@pytest.mark.parametrize("name", ["draft-model chain", "head tree"])
def test_estimate_is_within_a_factor_of_xla(monkeypatch, name):
  """The check's bytes (caches, loop state, activations; not the parameters) against XLA's memory_analysis() of
  the compiled loop (its arguments less the parameters, plus its temporaries): within a factor of 3 either way."""
  target, speculation, sampling = _cases()[name]
  need = _need(monkeypatch, target, speculation, sampling)
  lowered = jaxspec.lower(target, PROMPTS, speculation, sampling, max_new_tokens=NEW, max_input_length=64)
  analysis = lowered.loop.compile().memory_analysis()
  params = sum(x.nbytes for x in jax.tree.leaves(target.params))
  draft = speculation.draft
  params += sum(x.nbytes for x in jax.tree.leaves(draft.params)) if not isinstance(draft, jaxspec.NGramDraft) else 0
  if isinstance(draft, jaxspec.FeatureHead):
    params += target.params["embedding"].nbytes  # the head's params carry the target's embedding table
  xla = analysis.argument_size_in_bytes - params + analysis.temp_size_in_bytes
  assert xla / 3 <= need <= 3 * xla, (name, need, xla)


def test_every_speculation_drafts_from_one_source_placed_one_way():
  """Issue 30: `registry.draft_source` gives a `DraftSource` (the drafter and the params it reads) for every kind, and
  `placement.draft_params_on` places it one way: as it is without a mesh; on a mesh, arrays already there kept, the
  rest placed once (the same copy on the next call), a draft model's by its axes, and nothing stored on the user's
  object."""
  from jaxspec.decoding.device.drafter import DraftSource
  from jaxspec.sharding import make_mesh, mesh_of
  target, head, t5_target, _, t5_draft = _models()
  mesh = make_mesh(data=1, model=1, devices=jax.devices()[:1])
  on_mesh = jaxspec.shard(target, mesh)
  cases = [(on_mesh, jaxspec.Speculation(head, gamma=2), head), (t5_target, jaxspec.Speculation(t5_draft, gamma=2),
                                                                 t5_draft),
           (target, jaxspec.Speculation(jaxspec.NGramDraft(), gamma=2), None), (target, None, None)]
  for model, speculation, owner in cases:
    source = registry.draft_source(model, speculation)
    assert isinstance(source, DraftSource) and source.owner is (None if speculation is None else speculation.draft)
    assert (source.model is t5_draft) == (owner is t5_draft)
    assert placement.draft_params_on(source, None) is source.params
    if owner is None:
      assert source.params is None and placement.draft_params_on(source, mesh) is None
      continue
    before = dict(vars(owner))
    placed = placement.draft_params_on(source, mesh)
    leaves, again = jax.tree.leaves(placed), jax.tree.leaves(placement.draft_params_on(source, mesh))
    assert all(mesh_of(x) == mesh for x in leaves) and all(a is b for a, b in zip(leaves, again))
    assert vars(owner) == before  # the copy is kept beside the owner, not on it
    if owner is head:  # the target's embedding the head reads stays the target's placed array
      embedding = on_mesh.params["embedding"]
      assert any(x is embedding for x in jax.tree.leaves(placed["embed"])) or "embedding" in head.params


def _most_by_counting(need, budget, step, limit):
  """The largest multiple of step (<= limit) that fits, by asking every one in turn (the reference)."""
  most = 0
  for n in range(step, limit + 1, step):
    if need(n) > budget:
      break
    most = n
  return most


@pytest.mark.parametrize("shape", ["affine", "jumps", "concave"])
def test_most_that_fit_finds_the_largest_fitting_count_in_few_plans(shape):
  """`most_that_fit` (launch/plan.py's --slots search and the slot engine's refusal) equals counting up one by one
  on nondecreasing needs: a plan's bytes, straight in the rows (with the gathered rows' jumps at powers of two, or
  bent), over steps of 1, 2 and 4 rows, budgets from nothing fitting to everything fitting; on straight needs it
  asks for at most 4 (each a traced plan), where halving from the known count asks for about log2 of it."""
  rng = np.random.RandomState(["affine", "jumps", "concave"].index(shape))
  for _ in range(300):
    step = int(rng.choice([1, 2, 4]))
    limit = step * int(rng.choice([1, 3, 40, 600]))
    base, per, jump = int(rng.randint(0, 1000)), int(rng.randint(1, 50)), int(rng.randint(1, 400))
    need = {"affine": lambda n: base + per * n, "jumps": lambda n: base + per * n + jump * n.bit_length(),
            "concave": lambda n: base + per * n + int(30 * np.sqrt(n))}[shape]
    budget = int(rng.randint(0, need(limit) + 2 * per))
    known = step * int(rng.randint(1, limit // step + 1))
    asked = []
    most = memory_plan.most_that_fit(lambda n: (asked.append(n), need(n))[1], budget, known, step, limit)
    assert most == _most_by_counting(need, budget, step, limit), (shape, step, limit, budget, known)
    assert all(n % step == 0 and step <= n <= limit for n in asked), asked
    if shape == "affine":
      assert len(set(asked)) <= 4, (asked, budget, known)
  assert memory_plan.most_that_fit(lambda n: 10 * n, 25, 8, limit=2**20) == 2  # from above
  assert memory_plan.most_that_fit(lambda n: 10 * n, 10**9, 8, limit=2**20) == 2**20  # up to the limit
  assert memory_plan.most_that_fit(lambda n: 10 * n, 5, 8) == 0  # not even one
