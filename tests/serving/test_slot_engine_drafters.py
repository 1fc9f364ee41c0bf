"""Every drafter in the slot engine, on tiny in-process models: prompt lookup, a feature head and a draft model on a
decoder-only target, a T5 target's feature head (cross-attention to the encoder). Each engine runs a
load table (`SpeculationTable`): a chain of gamma 3 for one active slot, a token tree for two, plain
decoding for three, so that steps switch between a chain, a tree and resting drafters as requests join and leave;
at temperature 0 every request equals `generate`'s plain greedy tokens for its prompt alone, and greedy rows keep
their greedy tokens in a step whose program samples for another row. The table's JSON round-trip and the tuner's
table (`jaxspec.bench.tune.speculation_table`) are checked here too."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import jaxspec
from jaxspec.errors import SettingsError
from jaxspec.models import decoder_only as do
from jaxspec.models import eagle3, t5
from jaxspec.models.decoder_only.llama import LlamaConfig
from jaxspec.serving import RequestSettings, SlotEngine, SpeculationTable, TableEntry

from engine_helpers import Request, drive, generate_tokens

V, H = 16, 32
EOS = 4
MAX_NEW = 14
TABLE = SpeculationTable((TableEntry(max_active=1, gamma=3), TableEntry(max_active=2, gamma=2,
                                                                         tree=jaxspec.Tree(top_k=2, nodes=4)),
                          TableEntry(max_active=3, gamma=0)))
# Prompts of bucket 16 (padded to the engine's largest bucket, 32: the caches' and the lookup context's prompt
# positions) and one of bucket 32.
PROMPTS = [[3, 5, 7, 9, 11, 3, 5, 7], [4, 6], [8, 1, 12, 8, 1], [2], [14, 13, 12, 11, 10, 3, 7] * 3, [6, 6, 6, 6, 6]]


def _llama(seed: int, mix: float = 0.05) -> jaxspec.Model:
  cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                    head_dim=8, eos_ids=(EOS,), pad_token_id=0, bos_token_id=None)
  p = do.init_params(cfg, jax.random.PRNGKey(seed), std=1.0)
  p["layers"] = [dict(l, attention=dict(l["attention"], o=l["attention"]["o"] * mix / 4),
                      mlp=dict(l["mlp"], down=l["mlp"]["down"] * mix / 8)) for l in p["layers"]]
  return jaxspec.Model(cfg, p, name=f"tiny-llama-{seed}")


def _t5() -> jaxspec.Model:
  cfg = t5.T5Config(vocab_size=V, d_model=H, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=3, num_heads=4,
                    tie_word_embeddings=False, scale_decoder_outputs=False, eos_token_id=7, pad_token_id=0,
                    decoder_start_token_id=0)
  p = t5.init_params(cfg, jax.random.PRNGKey(0))
  p["decoder"]["layers"] = [dict(l, self_attention=dict(l["self_attention"], o=l["self_attention"]["o"] * 0.1),
                                 mlp=dict(l["mlp"], wo=l["mlp"]["wo"] * 0.1)) for l in p["decoder"]["layers"]]
  return jaxspec.Model(cfg, p, name="tiny-t5")


def _head(cross: bool) -> jaxspec.FeatureHead:
  cfg = eagle3.Eagle3Config(vocab_size=V, draft_vocab_size=12, hidden_size=H, target_hidden_size=H,
                            intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 1, 2),
                            encoder_hidden_size=H if cross else None)
  return jaxspec.FeatureHead(cfg, eagle3.init_params(cfg, jax.random.PRNGKey(1), std=0.5), name="tiny-head")


@functools.lru_cache(maxsize=None)
def _case(name: str):
  """(target, speculation) of each case."""
  if name == "ngram":
    return _llama(0), jaxspec.Speculation(jaxspec.NGramDraft(max_ngram=2), gamma=3)
  if name == "head":
    return _llama(0), jaxspec.Speculation(_head(cross=False), gamma=3)
  if name == "draft":
    return _llama(0), jaxspec.Speculation(_llama(0, mix=0.07), gamma=3)
  if name == "t5-head":
    return _t5(), jaxspec.Speculation(_head(cross=True), gamma=3)
  raise KeyError(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ngram", "head", "draft", "t5-head"])
def test_every_drafter_with_a_load_table_equals_plain_greedy(name):
  target, speculation = _case(name)
  engine = SlotEngine(target, speculation, slots=3, max_input_length=32, max_new_tokens=MAX_NEW,
                      iterations_per_step=2, table=TABLE)
  refs = [generate_tokens(target, p, MAX_NEW) for p in PROMPTS]
  # Load 1, 2, then 3 (PROMPTS[3] ends at its insert: EOS first), then down: every table entry runs, the drafters
  # lag and catch up.
  arrive = [0, 1, 3, 3, 3, 3]
  budgets = [MAX_NEW, MAX_NEW, 6, MAX_NEW, MAX_NEW, MAX_NEW]
  requests = [Request(p, RequestSettings(b), arrive=a) for p, a, b in zip(PROMPTS, arrive, budgets)]
  entries = []
  original_step = engine.step

  def step(**kw):
    out = original_step(**kw)
    entries.append(None if out.entry is None else TABLE.entries.index(out.entry))
    return out

  engine.step = step
  drive(engine, requests)
  for r, ref, b in zip(requests, refs, budgets):
    assert r.tokens == ref[:b], (name, r.prompt, r.tokens, ref[:b])
  assert {0, 1, 2} <= set(entries), entries
  assert any(a == 2 and b in (0, 1) for a, b in zip(entries, entries[1:])), entries  # drafting after plain


def test_the_draft_prefill_waits_for_the_first_drafting_step():
  """A draft model's prompt prefill is not in the insert (the first token comes from the target alone; the draft
  cache row is zeros: nothing of the slot's previous request survives); a step that drafts prefills it first
  (wakes the row); a request inserted at a load the table runs plain drafts nothing while the load stays plain, and
  when the load falls to a drafting entry it is woken and drafts, catching up on the tokens generated meanwhile;
  every request equals generate's greedy tokens; nothing compiles after warmup."""
  target, speculation = _case("draft")
  table = SpeculationTable((TableEntry(max_active=2, gamma=3), TableEntry(max_active=3, gamma=0)))
  engine = SlotEngine(target, speculation, slots=3, max_input_length=32, max_new_tokens=MAX_NEW,
                      iterations_per_step=2, table=table, modes=("greedy",))
  engine.warmup()
  compiled = engine.compiled_programs()
  refs = [generate_tokens(target, p, MAX_NEW) for p in PROMPTS[:5]]

  def draft_rows(slot):
    state = engine._state  # pylint: disable=protected-access
    leaves = jax.tree_util.tree_leaves((state.target_cache, state.draft_state.cache))
    axes = engine._layout.axes  # pylint: disable=protected-access
    n = len(jax.tree_util.tree_leaves(state.target_cache))
    return [np.take(np.asarray(x), slot, axis=a) for x, a in zip(leaves[n:], axes[n:]) if a is not None]

  def drafts(slot):
    return bool(engine._state.draft_state.drafts[slot])  # pylint: disable=protected-access

  eos = engine.insert(1, PROMPTS[3], RequestSettings(MAX_NEW))  # EOS first: it ends at insert, its slot free
  assert eos.tokens == refs[3] == [EOS] and eos.reason == "stop" and 1 in engine.free_slots()
  first = engine.insert(1, PROMPTS[4], RequestSettings(MAX_NEW))
  assert first.tokens == refs[4][:1] and not first.finished
  assert not drafts(1) and all(np.all(r == 0) for r in draft_rows(1))  # the draft's prefill is not in the insert
  out = engine.step()  # a drafting entry: woken first
  assert drafts(1) and any(np.any(r != 0) for r in draft_rows(1)) and out.drafted[1] > 0
  budgets = {0: 4, 1: MAX_NEW, 2: MAX_NEW}
  engine.free(1)
  tokens = {s: engine.insert(s, PROMPTS[s], RequestSettings(budgets[s])).tokens for s in budgets}
  assert not drafts(1) and all(np.all(r == 0) for r in draft_rows(1))  # the previous request's draft is gone
  plain_steps = 0
  drafted = {(s, plain): 0 for s in budgets for plain in (True, False)}
  for _ in range(100):
    out = engine.step()
    plain_steps += out.entry.plain
    for s in budgets:
      tokens[s] += out.tokens[s]
      drafted[(s, out.entry.plain)] += int(out.drafted[s])
    if not engine.active_slots():
      break
  assert plain_steps > 0 and all(drafted[(s, True)] == 0 for s in budgets)  # no drafts while the load runs plain
  assert drafts(1) and drafts(2)  # woken when slot 0 finished and 2 active slots draft
  assert drafted[(1, False)] > 0 and drafted[(2, False)] > 0
  for s, ref in zip(budgets, refs):
    assert tokens[s] == ref[:budgets[s]], (s, tokens[s], ref)
  assert engine.compiled_programs() == compiled


def test_greedy_rows_stay_greedy_beside_sampled_rows():
  """A greedy request's tokens are its greedy tokens in steps whose program samples for another row (one-hot p
  and q), here with a draft model's token tree (recursive rejection over one-hot siblings); chains:
  test_slot_engine.py's seeded test."""
  target, spec = _case("draft")
  spec = jaxspec.Speculation(spec.draft, gamma=2, tree=jaxspec.Tree(top_k=2, nodes=4))
  engine = SlotEngine(target, spec, slots=2, max_input_length=16, max_new_tokens=MAX_NEW, iterations_per_step=3)
  refs = [generate_tokens(target, p, MAX_NEW) for p in PROMPTS[:3]]
  requests = [Request(PROMPTS[0], RequestSettings(MAX_NEW)),
              Request(PROMPTS[1], RequestSettings(MAX_NEW, jaxspec.Sampling(1.0), seed=2)),
              Request(PROMPTS[2], RequestSettings(MAX_NEW, jaxspec.Sampling(0.0)), arrive=1)]
  drive(engine, requests)
  assert requests[0].tokens == refs[0] and requests[2].tokens == refs[2]


def test_table_json_round_trip_and_refusals():
  assert SpeculationTable.from_json(TABLE.to_json()) == TABLE
  assert [TABLE.choose(n).gamma for n in (0, 1, 2, 3, 9)] == [3, 3, 2, 0, 0]
  with pytest.raises(SettingsError, match="increasing"):
    SpeculationTable((TableEntry(4, 2), TableEntry(2, 1)))
  with pytest.raises(SettingsError, match="gamma"):
    TableEntry(2, gamma=-1)
  with pytest.raises(SettingsError, match="JSON"):
    SpeculationTable.from_json('{"rows": []}')
  with pytest.raises(SettingsError, match="needs a speculation"):
    SlotEngine(_llama(0), None, slots=2, max_input_length=16, max_new_tokens=4, table=TABLE)


def test_the_tuners_table():
  """`speculation_table` from tune rows (the keys `jaxspec.bench.sweep` writes): per batch size the fastest
  constant chain or tree of the draft, plain where nothing beats plain decoding by MIN_SPEEDUP."""
  from jaxspec.bench.tune import speculation_table

  def row(batch, gamma, speedup, schedule="constant", tree=None, draft="d", temperature=0.0):
    return dict(draft=draft, batch=batch, gamma=gamma, speedup=speedup, schedule=schedule, tree=tree,
                temperature=temperature)

  rows = [row(1, 2, 1.3), row(1, 4, 1.6), row(1, 6, 2.0, schedule="adaptive"), row(4, 2, 1.2),
          row(4, 3, 1.1, schedule="tree 2,4", tree=[2, 4]), row(4, 3, 1.5, schedule="tree 2,4", tree=[2, 4]),
          row(16, 2, 0.8), row(16, 1, 1.0), row(1, 4, 3.0, draft="other"), row(16, 4, 5.0, temperature=1.0)]
  table = speculation_table(rows, draft="d")
  assert table == SpeculationTable((TableEntry(1, 4), TableEntry(4, 3, jaxspec.Tree(2, 4)), TableEntry(16, 0)))
  assert SpeculationTable.from_json(table.to_json()) == table
  with pytest.raises(SettingsError, match="name the one"):
    speculation_table(rows)
  with pytest.raises(SettingsError, match="no 'constant'"):
    speculation_table(rows, draft="d", temperature=0.5)


def test_a_failed_row_stops_alone():
  """Non-finite logits (a NaN embedding row, fed only by one request's prompt) finish that request with reason
  "error"; the request beside it decodes on to its greedy tokens."""
  target = _llama(0)
  embedding = np.asarray(target.params["embedding"]).copy()
  embedding[15] = np.nan
  broken = jaxspec.Model(target.config, dict(target.params, embedding=jax.numpy.asarray(embedding)), name="nan")
  engine = SlotEngine(broken, None, slots=2, max_input_length=16, max_new_tokens=MAX_NEW, iterations_per_step=2)
  healthy = [3, 5, 7, 9]
  ref = generate_tokens(broken, healthy, MAX_NEW)
  requests = [Request([3, 15, 7], RequestSettings(MAX_NEW)), Request(healthy, RequestSettings(MAX_NEW))]
  drive(engine, requests)
  assert requests[0].reason == "error" and requests[0].tokens == []
  assert requests[1].tokens == ref and 15 not in ref
