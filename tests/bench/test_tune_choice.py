"""The tuner's choice is honest (issue 33, M11 and the tuner's "Low" items): a variant that drafted nothing is
plain decoding and is never chosen as a speedup; a variant is preferred over plain decoding only by more than the
spread of its per-round speedups; rounds are interleaved in a rotating order; `trees=` is checked (a Tree, not a
tuple or a string; a shape no gamma suits is refused, not silently dropped; duplicates timed once)."""

import re

import pytest

import jaxspec
from jaxspec.bench import timing, tune
from jaxspec.errors import SettingsError
from jaxspec.models import decoder_only
from jaxspec.models.decoder_only.llama import LlamaConfig
from script_helpers import random_params


def _row(speedup, draft="a", gamma=2, spread=0.0, drafted=1.5, fallback_share=0.0, rounds=3):
  return {"draft": draft, "gamma": gamma, "schedule": "constant", "temperature": 0.0, "batch": 1, "speculation": {},
          "speedup": speedup, "speedup_spread": spread, "rounds": rounds, "alpha": 0.5, "plain_ms_per_token": 2.0,
          "spec_ms_per_token": 2.0 / speedup, "tokens_per_iteration": 1.5, "mean_draft_length": drafted,
          "fallback_share": fallback_share, "c": 0.1, "r": 1.5, "expected_speedup_with_r": 1.0}


def test_a_variant_that_drafted_nothing_is_plain_decoding():
  """M11: 100% resting measured '1.46x' on a loaded machine; it decoded plainly, so plain decoding is the choice
  and the reason says so."""
  drafts = {"a": jaxspec.NGramDraft(), "b": jaxspec.NGramDraft(2)}
  rested = _row(1.46, "a", drafted=0.0, fallback_share=1.0)
  best = tune.choose([rested, _row(0.9, "b")], drafts)[(0.0, 1)]
  assert best.speculation is None and best.speedup == 1.0
  assert "a constant gamma 2 drafted nothing (rested throughout): it is plain decoding" in best.why
  # Beside a variant that did draft and wins by more than its spread, that one is chosen, not the rested one.
  best = tune.choose([rested, _row(1.2, "b", spread=0.05)], drafts)[(0.0, 1)]
  assert best.draft_name == "b" and best.speedup == 1.2


def test_a_variant_must_win_by_more_than_its_spread():
  drafts = {"a": jaxspec.NGramDraft()}
  noisy = tune.choose([_row(1.10, spread=0.12)], drafts)[(0.0, 1)]  # 1.10x +- 0.12: could be slower than plain
  assert noisy.speculation is None and "within its spread" in noisy.why and "0.12" in noisy.why
  clear = tune.choose([_row(1.10, spread=0.03)], drafts)[(0.0, 1)]  # 1.10 > 1.02 + 0.03
  assert clear.draft_name == "a" and "+- 0.03" in clear.why
  one_round = tune.choose([_row(1.10, rounds=1)], drafts)[(0.0, 1)]
  assert one_round.draft_name == "a" and "1 round: no spread measured" in one_round.why


def test_rounds_rotate_their_order_and_keep_every_total():
  order = []
  fns = {name: (lambda b, name=name: order.append(name)) for name in ("plain", "x", "y")}
  passes, _ = timing.interleaved_passes(fns, [0], repeats=3)
  rounds = [order[3 + 3 * i:6 + 3 * i] for i in range(3)]  # after the warm-up pass
  assert rounds == [["plain", "x", "y"], ["x", "y", "plain"], ["y", "plain", "x"]]
  assert all(len(p.totals_s) == 3 for p in passes.values())


@pytest.fixture(scope="module")
def llama() -> jaxspec.Model:
  cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, eos_ids=(1,), pad_token_id=0, bos_token_id=None)
  return jaxspec.Model(cfg, random_params(decoder_only.param_shapes(cfg), 0), name="tiny-llama")


def test_tune_checks_its_trees_before_timing(llama):
  ngram = {"ngram": jaxspec.NGramDraft()}
  for trees, needle in (([(2, 3)], "trees must be jaxspec.Tree"), (["2,3"], "trees must be jaxspec.Tree"),
                        ([jaxspec.Tree(2, 9)], "Tree(top_k=2, nodes=9) suits none of gammas [1, 2]"),
                        ([jaxspec.Tree(1, 3)], "Tree(top_k=1, nodes=3) suits none of gammas [1, 2]")):
    with pytest.raises(SettingsError, match=re.escape(needle)):
      jaxspec.tune(llama, ngram, [[5, 9, 12]], gammas=(1, 2), trees=trees)
  variants = tune.variants(ngram, gammas=(1, 2, 2), schedules=("constant",),
                           trees=[jaxspec.Tree(2, 3), jaxspec.Tree(2, 3)])
  assert [(v.gamma, v.label) for v in variants] == [(1, "constant"), (2, "constant"), (2, "tree 2,3")]


def test_gamma_auto_calibrates_over_repeated_rounds_and_says_plain_for_a_rested_variant(monkeypatch, capsys):
  """M11: translate.py's --gamma=auto (jobs.calibrate) times every variant over 3 interleaved rounds, not once, and
  a choice that rested throughout is printed as plain decoding."""
  import types
  from jaxspec.cli import jobs
  seen = {}
  def fake_tune(target, drafts, ids, **kw):
    seen.update(kw)
    rows = [_row(1.46, "ngram", drafted=0.0, fallback_share=1.0)]
    return tune.TuneResult(rows=rows, best=tune.choose(rows, drafts), meta={})
  monkeypatch.setattr(jobs.tune, "tune", fake_tune)
  monkeypatch.setattr(jobs, "encode_texts", lambda tokenizer, texts, **kw: [[5, 6, 7]] * len(texts))
  monkeypatch.setattr(jobs, "tune_table", lambda rows: [])
  choice = jobs.calibrate(types.SimpleNamespace(tokenizer=None), {"ngram": jaxspec.NGramDraft()}, ["a", "b"],
                          gammas=[2])
  assert seen["repeats"] >= 3
  assert choice.speculation is None
  assert "chosen: plain decoding: no variant drafted anything; ngram constant gamma 2 drafted nothing" in (
      capsys.readouterr().out)


def test_the_table_shows_the_spread_and_names_a_rested_row_plain():
  from jaxspec.bench import report
  extra = dict(tau=0.5, acceptance_per_position=[0.5, 0.4], c_alternating=0.1, draft_step_ms=0.1,
               spec_tokens_per_s=500.0, spec_latency_s={"p50": 0.1, "p90": 0.2, "p99": 0.3})
  rows = [dict(_row(1.20, spread=0.04), **extra), dict(_row(1.46, "b", drafted=0.0, fallback_share=1.0), **extra)]
  table = "\n".join(report.tune_table(rows))
  assert "1.20x +- 0.04" in table
  assert "1.46x (drafted nothing: plain)" in table
