"""The tuner (`jaxspec.tune`, launch/tune.py) and the pool in launch/translate.py (--draft=A,ngram --gamma=auto).

Tiny random models (the embedded tokenizer, 1-layer T5s) keep the runs short. What is checked is the table's shape
(every column, one row per draft x gamma x schedule x batch x temperature, the best choice per (temperature,
batch), the plots) and the choice's logic on given rows: never a timing.
"""

import json
import math
import re

import numpy as np
import pytest

import jaxspec
from jaxspec.bench import report, tune
from jaxspec.errors import CheckpointError
from jaxspec.models import decoder_only, eagle3
from jaxspec.models.decoder_only.llama import LlamaConfig
from jaxspec.serving import SpeculationTable
from script_helpers import (assert_one_line_error, random_head, random_params, run_script, run_scripts, tiny_head,
                            tiny_pair)

NUMBERS = ("alpha", "tau", "tokens_per_iteration", "mean_draft_length", "fallback_share", "c", "r", "c_alternating",
           "draft_step_ms", "target_step_ms", "plain_ms_per_token", "spec_ms_per_token", "plain_tokens_per_s",
           "spec_tokens_per_s", "speedup", "expected_speedup", "expected_speedup_with_r", "cost_model_speedup",
           "expected_speedup_workload")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """A tiny target, a random draft, and the target saved again as a draft that is always right."""
  root = tmp_path_factory.mktemp("models")
  target, draft = tiny_pair(str(root))
  same = str(root / "same")
  jaxspec.save(jaxspec.load(target), same)
  return target, draft, same


def _row(speedup, draft="d", gamma=2, schedule="constant", temperature=0.0, batch=1):
  return {"draft": draft, "gamma": gamma, "schedule": schedule, "temperature": temperature, "batch": batch,
          "speculation": {"draft_cost": 0.1} if schedule == "adaptive" else {}, "speedup": speedup, "alpha": 0.5,
          "plain_ms_per_token": 2.0, "spec_ms_per_token": 2.0 / speedup, "tokens_per_iteration": 1.5,
          "mean_draft_length": gamma, "c": 0.1, "r": 1.5, "expected_speedup_with_r": 1.0}


def test_choice_is_the_fastest_row_or_plain_decoding():
  rows = [_row(1.30, "a", 2), _row(1.45, "a", 3, "adaptive"), _row(0.90, "b", 2),
          _row(1.01, "a", 2, batch=4), _row(0.70, "b", 3, batch=4),
          _row(0.95, "a", 2, temperature=1.0)]
  drafts = {"a": jaxspec.NGramDraft(), "b": jaxspec.NGramDraft(2)}
  best = tune.choose(rows, drafts)
  assert sorted(best) == [(0.0, 1), (0.0, 4), (1.0, 1)]
  top = best[(0.0, 1)]
  s = top.speculation  # the choice is a Speculation, passed to generate as it is
  assert (top.draft_name, s.draft, s.gamma, s.schedule, s.draft_cost, top.speedup) == (
      "a", drafts["a"], 3, "adaptive", 0.1, 1.45)
  assert "1.45x" in top.why and "next: a constant gamma 2 1.30x" in top.why
  for key in ((0.0, 4), (1.0, 1)):  # 1.01x is within noise of plain (MIN_SPEEDUP); 0.95x loses
    assert best[key].speculation is None and best[key].draft_name is None
    assert "no variant" in best[key].why
  assert tune.choose(rows, drafts, min_speedup=1.0)[(0.0, 4)].draft_name == "a"


def test_adaptive_fields_come_from_theorem_3_8():
  for c, r, gamma in ((0.05, 1.0, 4), (0.1, 2.0, 3), (0.0, 1.6, 2), (0.3, 2.5, 8)):
    knobs = tune.adaptive_fields(c, r, gamma)
    assert knobs["draft_cost"] == pytest.approx(c / r)
    a = knobs["fallback_alpha"]
    best = lambda x: max(jaxspec.expected_speedup(x, k, c, r) for k in range(1, gamma + 1))
    if a > 0:  # below it every draft length is expected to lose FALLBACK_VALUE or more against plain decoding
      assert best(a) == pytest.approx(tune.FALLBACK_VALUE, abs=1e-6) and best(a * 0.9) < tune.FALLBACK_VALUE
  assert tune.break_even_alpha(0.0, 0.9, 3) == 0.0  # a verify call cheaper than a step: always worth drafting
  assert tune.break_even_alpha(1.0, 3.0, 2) == 1.0  # never worth it
  assert tune.break_even_alpha(0.1, 2.0, 3) > tune.break_even_alpha(0.1, 1.2, 3)  # costlier verify, higher bar
  # With the draft's measured alpha: a paying draft rests only NOISE_MARGIN below it; a losing one as before.
  c, r, gamma = 0.2, 2.1, 3
  plain_rule = tune.adaptive_fields(c, r, gamma)["fallback_alpha"]
  paying = tune.adaptive_fields(c, r, gamma, alpha=0.87)
  assert paying["prior_alpha"] == 0.87 and tune.break_even_alpha(c, r, gamma) < 0.87
  assert paying["fallback_alpha"] == pytest.approx(min(plain_rule, 0.87 - tune.NOISE_MARGIN))
  assert paying["fallback_alpha"] < plain_rule
  losing = tune.adaptive_fields(c, r, gamma, alpha=0.5)
  assert losing["fallback_alpha"] == plain_rule > losing["prior_alpha"]  # starts below it: rests at once


def test_tune_script_writes_a_complete_table(models, tmp_path):
  target, _, same = models
  tsv = tmp_path / "pairs.tsv"
  tsv.write_text("en\tde\tsource\n" + "".join(f"{e}\t{d}\tx (ding)\n" for e, d in [
      ("The house is small.", "Das Haus ist klein."), ("Hello.", "Hallo."), ("Good morning.", "Guten Morgen."),
      ("Thank you.", "Danke.")]))
  out = tmp_path / "tune"
  table_path = tmp_path / "table.json"  # an earlier run's table: replaced (anything else is refused, below)
  table_path.write_text('{"entries": [{"max_active": 1, "gamma": 3, "tree": null}]}')
  res = run_script(["launch/tune.py", f"--target={target}", f"--drafts={same},ngram", f"--input={tsv}",
                    "--gammas=2", "--batch_sizes=2", "--temperatures=0,1", "--repeats=1", "--max_new_tokens=5",
                    "--noitl", f"--output_dir={out}", f"--speculation_table={table_path}"])
  assert res.returncode == 0, res.stderr[-3000:]
  table = SpeculationTable.read(str(table_path))
  assert [e.max_active for e in table.entries] == [2] and table.entries[0].gamma in (0, 2)
  result = json.loads((out / "tune.json").read_text())
  rows = result["rows"]
  grid = {(r["draft"], r["schedule"], r["gamma"], r["batch"], r["temperature"]) for r in rows}
  assert len(rows) == len(grid) == 2 * 2 * 1 * 1 * 2  # drafts x schedules x gammas x batches x temperatures
  for r in rows:
    for key in NUMBERS:
      if key == "alpha" and r["mean_draft_length"] == 0:
        # Nothing was verified, alpha is undefined (NaN): no n-gram ever matched, or an adaptive row rested
        # throughout (the target as its own draft costs c ~ 1: Theorem 3.8 says drafting never pays, and a
        # calibrated prior a rounding below fallback_alpha 1.0 starts it resting).
        assert math.isnan(r[key]) and (r["draft"] == "ngram" or r["fallback_share"] == 1.0)
        continue
      assert isinstance(r[key], float) and math.isfinite(r[key]), (key, r[key], r)
    assert len(r["acceptance_per_position"]) == r["gamma"] == len(r["draft_lengths"]) - 1
    for key in ("plain_latency_s", "spec_latency_s"):
      assert r[key]["p50"] <= r[key]["p90"] <= r[key]["p99"], key
    assert "plain_itl_ms" not in r and "spec_itl_ms" not in r  # --noitl: no streaming pass (ITL: the tree test)
    for key in ("quality", "plain_quality"):
      assert 0 <= r[key]["bleu"] <= 100 and 0 <= r[key]["chrf"] <= 100
    if r["temperature"] == 0:
      assert r["identical_to_plain"] is True and r["quality"] == r["plain_quality"]
    if r["draft"] == same and r["mean_draft_length"] > 0:  # the target as its own draft: always its own token
      assert r["alpha"] == pytest.approx(1.0, abs=1e-5)  # a block and a step may round apart at temperature 1
    if r["draft"] == "ngram":
      assert r["c"] == 0.0 and r["draft_step_ms"] == 0.0
    fields = r["speculation"]
    if r["schedule"] == "adaptive":
      assert fields["draft_cost"] is not None and 0 <= fields["fallback_alpha"] <= 1
      if r["draft"] == same:  # calibrated on the inputs: the target as its own draft is always accepted
        assert fields["prior_alpha"] == pytest.approx(1.0, abs=1e-5)
    else:  # constant: the Speculation's defaults
      assert fields["draft_cost"] is None and fields["fallback_alpha"] == 0 and fields["prior_alpha"] == 1
  assert sorted(result["best"]) == ["T=0,batch=2", "T=1,batch=2"]
  for choice in result["best"].values():
    assert choice["draft"] in (None, same, "ngram") and choice["why"]
  table = (out / "tune.md").read_text()
  assert "| Temp | Batch | draft" in table and table.count("\n| ") >= 1 + len(rows) + 1 + 2
  assert table.count("Best at temperature") == 2
  for png in ("speedup_vs_gamma.png", "acceptance.png"):
    assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _table_refusals(tmp_path) -> list[tuple[list[str], str]]:
  """tune.py runs whose --speculation_table is refused (arguments, the refusal's words), and their files."""
  tsv, notes, out = tmp_path / "in.tsv", tmp_path / "notes.json", tmp_path / "out"
  tsv.write_text("en\tde\nHello.\tHallo.\n")
  notes.write_bytes(b"\x89PNG\r\n\x1a\n\x00")
  out.mkdir()
  base = ["launch/tune.py", "--target=no-such-model", f"--input={tsv}", f"--output_dir={out}"]
  return [(base + [f"--speculation_table={tsv}"], "is the --input file"),
          (base + [f"--speculation_table={notes}"], "exists and is not a speculation table"),
          (base + [f"--speculation_table={out / 'tune.json'}"], "is tune.json of --output_dir"),
          (base + [f"--speculation_table={tmp_path / 'new.json'}", "--schedules=adaptive"],
           "add 'constant' to --schedules")]


@pytest.fixture(scope="module")
def forked(models, tmp_path_factory):
  """The module's independent script runs after the tune script's, forked together from one interpreter
  (`run_scripts`): tune.py's --speculation_table refusals ("refusals": [(run, words)], their files under
  "refusals_dir") and translate.py's pool ("pool", "no_draft", "bad_gamma"; its files under "pool_dir").
  Requested first by test_tune_refuses_a_table_path_before_loading_or_timing, which runs after
  test_tune_script_writes_a_complete_table: the pool's calibration loads that run's programs from the cache."""
  target, draft, _ = models
  refused_dir, pool_dir = tmp_path_factory.mktemp("refusals"), tmp_path_factory.mktemp("pool")
  refusals = _table_refusals(refused_dir)
  head = tiny_head(pool_dir / "head")
  inputs = pool_dir / "in.txt"
  inputs.write_text("The house is small.\nHello.\n\nGood morning.\nThank you.\n")
  # --gamma=auto needs a draft to choose from; a bad --gamma stops at parsing (checked in the pool's test).
  # The calibration's batch size and token budget are test_tune_script_writes_a_complete_table's (same shapes: the
  # plain and constant-gamma programs load from the run's compilation cache instead of compiling again).
  pool = [
      ["launch/translate.py", f"--target={target}", f"--draft={draft},{head},ngram", "--gamma=auto", "--tree=2,3",
       "--tune_gammas=2", "--calibration_inputs=3", "--max_new_tokens=5", "--batch_size=2", f"--input={inputs}",
       f"--output={pool_dir / 'out.txt'}"],
      ["launch/translate.py", f"--target={target}", "--draft=", "--gamma=auto", f"--input={inputs}"],
      ["launch/translate.py", "--gamma=fast", "--target=no-such-model"]]
  results = run_scripts([args for args, _ in refusals] + pool)
  return {"refusals": list(zip(refusals, results)), "refusals_dir": refused_dir, "pool_dir": pool_dir,
          **dict(zip(("pool", "no_draft", "bad_gamma"), results[len(refusals):]))}


def test_tune_refuses_a_table_path_before_loading_or_timing(forked):
  """Issue 40 item 2: --speculation_table replaced any file, its own --input included (exit 0); a sweep without the
  rows a table is made of was refused only after the timing. Now each is one line before any model loads. (The
  runs: `forked`.)"""
  for (_, needle), res in forked["refusals"]:
    assert_one_line_error(res, "--speculation_table=", needle)
    assert "no-such-model" not in res.stderr  # before the target is looked for
  tsv, notes = forked["refusals_dir"] / "in.tsv", forked["refusals_dir"] / "notes.json"
  assert tsv.read_text() == "en\tde\nHello.\tHallo.\n" and notes.read_bytes() == b"\x89PNG\r\n\x1a\n\x00"


def test_tune_rejects_bad_arguments(models):
  target = jaxspec.load(models[0])
  for kwargs, needle in ((dict(drafts={}), "drafts must be a non-empty dict"),
                         (dict(drafts={"x": "ende-draft"}), "drafts['x'] must be a jaxspec.Model"),
                         (dict(references=["a"]), "references must hold one text per input"),
                         (dict(gammas=[0]), "gammas must be"), (dict(schedules=["fast"]), "schedules must be")):
    args = dict(drafts={"ngram": jaxspec.NGramDraft()}, inputs=["Hello.", "Thank you."])
    args.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(needle)):
      jaxspec.tune(target, args.pop("drafts"), args.pop("inputs"), **args)


@pytest.fixture(scope="module")
def llama() -> jaxspec.Model:
  """A tiny random Llama (2 layers, no tokenizer): feature heads draft for decoder-only targets."""
  cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, eos_ids=(1,), pad_token_id=0, bos_token_id=None)
  return jaxspec.Model(cfg, random_params(decoder_only.param_shapes(cfg), 0), name="tiny-llama")


def _head(target_hidden_size: int = 32) -> jaxspec.FeatureHead:
  """A random EAGLE-3 head for `llama` (its features target_hidden_size wide: 32 fits it)."""
  return random_head(eagle3.Eagle3Config(vocab_size=64, draft_vocab_size=32, hidden_size=32,
                                         target_hidden_size=target_hidden_size, intermediate_size=64, num_heads=4,
                                         num_kv_heads=2, head_dim=8, aux_layer_ids=(0, 0, 1)))


def test_tune_sweeps_a_feature_head_and_its_choice_decodes_exactly(llama):
  """A head among the drafts (issue 21 item 6): its own gamma rows, its own measured c (its step, not prompt
  lookup's 0) and prefill time; the choice (forced with min_speedup=0: nothing beats a tiny target) is a
  Speculation of the head that decodes as plain greedy decoding does. (Adaptive rows with a head: the pool test.)"""
  head = _head()
  prompts = [[5, 9, 12, 3, 40], [30, 2, 11, 8, 9, 13, 50]]
  plain = jaxspec.generate(llama, prompts, max_new_tokens=6)  # the tuner's plain passes reuse its compilation
  result = jaxspec.tune(llama, {"eagle3": head}, prompts, gammas=(1, 2), batch_sizes=(2,), schedules=("constant",),
                        repeats=1, max_new_tokens=6, itl=False, min_speedup=0.0, verbose=False)
  assert sorted(r["gamma"] for r in result.rows) == [1, 2]
  for r in result.rows:
    assert r["draft"] == "eagle3" and r["identical_to_plain"] is True
    assert r["c"] > 0 and r["c_alternating"] > 0 and r["draft_step_ms"] > 0  # measured, not a lookup's 0
    assert r["encoder_ms_per_call"]["16"]["eagle3"] > 0  # the head's prefill, paid once per call
  assert "FeatureHead" in result.meta["drafts"]["eagle3"]
  choice = result.best[(0.0, 2)]
  assert choice.speculation.draft is head and choice.draft_name == "eagle3"
  assert choice.describe().startswith("eagle3, gamma ")
  spec = jaxspec.generate(llama, prompts, choice.speculation, max_new_tokens=6)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_tune_refuses_a_head_for_another_target_before_timing(llama):
  with pytest.raises(CheckpointError, match=r"drafts\['other'\]: the EAGLE-3 head does not fit this target: .*"
                                            r"target_hidden_size"):
    jaxspec.tune(llama, {"ngram": jaxspec.NGramDraft(), "other": _head(target_hidden_size=48)}, [[5, 9, 12]],
                 gammas=(2,))


def test_translate_pool_calibrates_then_uses_the_choice(models, forked):
  """A pool of a draft model, an EAGLE-3 head directory (issue 21 item 6) and prompt lookup: every one's rows in
  the table, then the choice translates everything (the script fails when its greedy output differs from plain).
  (The runs: `forked`.)"""
  _, draft, _ = models
  head, out = str(forked["pool_dir"] / "head"), forked["pool_dir"] / "out.txt"
  res, no_draft, bad_gamma = forked["pool"], forked["no_draft"], forked["bad_gamma"]
  assert res.returncode == 0, res.stderr[-3000:]
  assert "calibrating on" in res.stderr
  assert "| Temp | Batch | draft" in res.stdout  # the table, then the choice and why
  for name in (draft, head, "ngram"):
    for schedule in ("constant", "adaptive"):
      assert re.search(rf"\| {re.escape(name)} +\| {schedule} +\| 2 +\|", res.stdout), (name, schedule)
  for name in (draft, head, "ngram"):  # --tree: token trees calibrated beside the chains, for every draft
    assert re.search(rf"\| {re.escape(name)} +\| tree 2,3 +\| 2 +\|", res.stdout), name
  chosen = next(line for line in res.stdout.splitlines() if line.startswith("chosen: "))
  assert "plain decoding" in chosen or "gamma" in chosen
  assert len(out.read_text().split("\n")) == 5 + 1 and "== summary" in res.stdout
  assert_one_line_error(no_draft, "--gamma=auto needs at least one --draft")
  assert_one_line_error(bad_gamma, "--gamma=fast", "'auto'")


def test_tune_tries_token_trees_and_chooses_one():
  """`trees=`: every tree shape at every gamma deep enough, with draft models and prompt lookup (schedule
  "constant"); a winning tree row becomes a Speculation with that tree."""
  tree_row = dict(_row(1.6, "a", 3), schedule="tree 2,4", tree=[2, 4])
  best = tune.choose([_row(1.3, "a", 3), tree_row], {"a": jaxspec.NGramDraft()})[(0.0, 1)]
  assert best.speculation.tree == jaxspec.Tree(2, 4) and best.speculation.gamma == 3
  assert "tree top_k 2 nodes 4" in best.describe() and best.to_json()["tree"] == [2, 4]


def test_tune_measures_tree_rows_that_decode_exactly(llama):
  """Tree rows beside chains, every one exact; and the streaming pass's inter-token latencies (`itl`, the
  default, here the only sweep that runs it: the script's run above passes --noitl to save its streaming
  programs' compiles)."""
  prompts = [[5, 9, 12, 3, 40, 5, 9, 12], [30, 2, 11, 8, 9, 13, 50, 2, 11]]
  result = jaxspec.tune(llama, {"ngram": jaxspec.NGramDraft()}, prompts, gammas=(1, 2), batch_sizes=(2,),
                        schedules=("constant",), trees=[jaxspec.Tree(2, 3)], repeats=1, max_new_tokens=6,
                        min_speedup=0.0, verbose=False)
  shapes = sorted((r["schedule"], r["gamma"]) for r in result.rows)
  assert shapes == [("constant", 1), ("constant", 2), ("tree 2,3", 2)]  # depth 1 proposes only 2 < 3 nodes
  assert all(r["identical_to_plain"] is True for r in result.rows)
  for r in result.rows:
    for key in ("plain_itl_ms", "spec_itl_ms"):
      assert 0 < r[key]["p50"] <= r[key]["p90"] <= r[key]["p99"], (key, r[key])
  table = report.tune_markdown(result)
  cells = lambda stats: report._cells(stats, ".1f")  # pylint: disable=protected-access
  assert all(cells(r["spec_itl_ms"]) in table and cells(r["plain_itl_ms"]) in table for r in result.rows), table
