"""The EN-DE pipeline: data files, corpus rebuilding, batching, training (resumable), translate.py."""

import json
import os
import shutil
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.training import steps
from jaxspec.data.ende import Pair, bucketed_batches, distillation_sources, length_buckets, read_pairs, write_pairs
from jaxspec.models import t5
from jaxspec.tokenizer import load_tokenizer
from script_helpers import run_script, run_scripts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
SENTENCES = [("The house is small.", "Das Haus ist klein."), ("The dog is big.", "Der Hund ist groß."),
             ("Open the file.", "Öffnen Sie die Datei."), ("The cat sleeps.", "Die Katze schläft."),
             ("Save the document now.", "Speichern Sie das Dokument jetzt."),
             ("I like green tea.", "Ich mag grünen Tee.")]


def test_tsv_round_trip_and_bad_header(tmp_path):
  pairs = [Pair(en, de, "test") for en, de in SENTENCES]
  write_pairs(str(tmp_path / "a.tsv.gz"), pairs)
  assert read_pairs(str(tmp_path / "a.tsv.gz")) == pairs
  (tmp_path / "bad.tsv").write_text("english\tgerman\nx\ty\n")
  with pytest.raises(ValueError, match="expected a header"):
    read_pairs(str(tmp_path / "bad.tsv"))


def test_bucketed_batches_cover_each_pair_once_with_fixed_shapes():
  rng = np.random.RandomState(0)
  src = [list(rng.randint(3, 50, size=rng.randint(1, 30))) + [1] for _ in range(300)]
  tgt = [list(rng.randint(3, 50, size=rng.randint(1, 90))) + [1] for _ in range(300)]
  seen, shapes = [], {}
  for inputs, labels in bucketed_batches(src, tgt, 256, 64, np.random.RandomState(1)):
    assert inputs.shape == labels.shape
    assert shapes.setdefault(inputs.shape[1], inputs.shape) == inputs.shape  # one shape per bucket
    for row in labels:
      if row.any():
        seen.append(row)
        assert row[row != 0][-1] == 1  # EOS kept, even when truncated to 64
  assert len(seen) == 300


def _write_mo(path, messages):
  """A minimal GNU .mo file (the format gettext.GNUTranslations reads), UTF-8."""
  messages = {"": "Content-Type: text/plain; charset=UTF-8\n", **messages}
  keys = sorted(messages)
  ids, strs = b"", b""
  offsets = []
  for k in keys:
    offsets.append((len(ids), len(k.encode()), len(strs), len(messages[k].encode())))
    ids += k.encode() + b"\0"
    strs += messages[k].encode() + b"\0"
  n = len(keys)
  start = 7 * 4 + 16 * n
  table_ids = b"".join(struct.pack("<II", l, start + o) for o, l, _, _ in offsets)
  table_strs = b"".join(struct.pack("<II", l, start + len(ids) + o) for _, _, o, l in offsets)
  header = struct.pack("<7I", 0x950412de, 0, n, 7 * 4, 7 * 4 + 8 * n, 0, 0)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(header + table_ids + table_strs + ids + strs)


def test_build_corpus_from_gettext_catalogs(tmp_path):
  msgs = {f"Open the _file number {i}": f"Öffnen Sie die _Datei Nummer {i}" for i in range(40)}
  msgs["%s files"] = "%s Dateien"  # format strings are skipped
  _write_mo(tmp_path / "locale" / "de" / "LC_MESSAGES" / "demo.mo", msgs)
  out = tmp_path / "corpus"
  res = run_script(["launch/build_corpus.py", f"--locale_roots={tmp_path / 'locale'}", f"--output_dir={out}",
                    "--dev_size=5", "--ding=/nonexistent"])
  assert res.returncode == 0, res.stderr[-2000:]
  train = read_pairs(str(out / "train.tsv.gz"))
  dev, test = read_pairs(str(out / "dev.tsv")), read_pairs(str(out / "test.tsv"))
  assert len(train) + len(dev) + len(test) == 40 and len(dev) == len(test) == 5
  assert not {p.en for p in dev} & {p.en for p in train}
  assert all("_" not in p.en and "_" not in p.de for p in train)  # mnemonics removed


def test_distillation_loss_is_zero_for_identical_models_and_training_learns():
  cfg = t5.T5Config(vocab_size=20, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)
  params = t5.init_params(cfg, jax.random.key(0))
  inputs = jnp.asarray(np.random.RandomState(0).randint(2, 20, size=(4, 6)), jnp.int32)
  labels = jnp.asarray(np.random.RandomState(1).randint(2, 20, size=(4, 5)), jnp.int32)
  teacher_logits = t5.forward(params, cfg, inputs, steps.shift_right(labels, 0))
  _, m = steps.loss_fn(params, cfg, inputs, labels, teacher_logits, 0.5)
  assert float(m["kl"]) == pytest.approx(0.0, abs=1e-5)
  opt = steps.make_optimizer(1e-2, 2, 50)
  state = opt.init(params)
  settings = steps.StepConfig(model=cfg)
  first = None
  for _ in range(30):
    params, state, metrics = steps.train_step(settings, opt, params, state, inputs, labels)
    first = first if first is not None else float(metrics["ce"])
  assert float(metrics["ce"]) < 0.5 * first


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
  """A tiny corpus, tokenizer, and a tiny trained target with a draft distilled from it."""
  import sentencepiece as spm
  from jaxspec.tokenizer import write_sentencepiece_tokenizer
  root = tmp_path_factory.mktemp("ende")
  pairs = [Pair(en, de, "deb trans-de-en (ding)") for en, de in SENTENCES] * 8
  write_pairs(str(root / "train.tsv.gz"), pairs)
  write_pairs(str(root / "dev.tsv"), pairs[:6])
  with open(root / "text.txt", "w") as f:
    for p in pairs:
      f.write(p.en + "\n" + p.de + "\n")
  spm.SentencePieceTrainer.train(input=str(root / "text.txt"), model_prefix=str(root / "sp"), vocab_size=60,
                                 pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2)
  write_sentencepiece_tokenizer(str(root / "sp.model"), str(root / "tok"))
  common = [f"--config.tokenizer={root / 'tok'}", f"--config.train={root / 'train.tsv.gz'}",
            f"--config.dev={root / 'dev.tsv'}", "--config.log_every=5", "--config.eval_every=1000",
            "--config.checkpoint_every=5", "--config.dev_bleu_sentences=0", "--config.dev_loss_pairs=6",
            "--config.tokens_per_batch=64", "--config.warmup_steps=2",
            # One length bucket: one train program per run (the default buckets compile four; bucketing has its
            # own test above). Dev BLEU (a greedy decode per evaluation) only where a test reads it.
            "--config.max_len=32", "--config.length_buckets=32"]
  tiny = ["--config.model.d_model=16", "--config.model.d_kv=4", "--config.model.d_ff=32",
          "--config.model.num_layers=1", "--config.model.num_decoder_layers=1", "--config.model.num_heads=2"]
  return root, common, tiny


@pytest.fixture(scope="module")
def translate_setup(tiny_setup, tmp_path_factory):
  """test_translate_script's files: a random target "t" and draft "d" with the tiny tokenizer, a draft whose
  tokenizer differs ("other_tok"), an input file and a longer one (a line over --max_input_length=16 more).
  (directory, the model flags, in.txt, longer.txt)."""
  root, _, _ = tiny_setup
  tmp_path = tmp_path_factory.mktemp("translate")
  tok = load_tokenizer(str(root / "tok"))
  cfg = t5.T5Config(vocab_size=tok.vocab_size, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                    num_heads=2)
  for name, seed in (("t", 0), ("d", 1)):
    jaxspec.save(jaxspec.Model(cfg, t5.init_params(cfg, jax.random.key(seed)), tok), str(tmp_path / name))
  models = [f"--target={tmp_path / 't'}", f"--draft={tmp_path / 'd'}", "--max_new_tokens=8",
            "--max_input_length=16"]
  inputs, longer = tmp_path / "in.txt", tmp_path / "longer.txt"
  inputs.write_text("The house is small.\n\nThe dog is big.\nOpen the file.\n")
  longer.write_text(inputs.read_text() + "word " * 200 + "\n")  # one line more, longer than 16 tokens
  other = tmp_path / "other_tok"  # a draft whose tokenizer differs
  from transformers import AutoTokenizer
  shutil.copytree(tmp_path / "d", other)
  hf_tok = AutoTokenizer.from_pretrained(str(root / "tok"))
  hf_tok.add_tokens(["<extra_word>"])
  hf_tok.save_pretrained(str(other))
  return tmp_path, models, inputs, longer


@pytest.fixture(scope="module")
def training_runs(tiny_setup, translate_setup):
  """The launch/train.py runs of the two tests below, forked from one interpreter that imported JAX and jaxspec
  once, as many at a time as there are CPUs: a target trained 10 steps and, beside it, one trained 12 steps at a
  high learning rate exporting its best dev loss; then, from the first's workdir and its export (copied: the resume
  replaces the export), the resume with a longer schedule, a target continued from the export in a new workdir and
  a draft distilled from it. The first batch also forks test_translate_script's independent runs ("translate",
  "refused", "unknown", "differs"), the second its resume of "translate" ("translate_resume"; "translate_lines":
  the output's lines before it). {name: CompletedProcess}."""
  root, common, tiny = tiny_setup
  directory, models, inputs, longer = translate_setup
  target = ["launch/train.py", "--config=configs/ende.py:target"]
  first_batch = {
      "first": target + [f"--workdir={root / 'target'}", "--config.train_steps=10"] + common + tiny
      + ["--config.dev_bleu_sentences=4"],
      "best": target + [f"--workdir={root / 'best'}", "--config.train_steps=12", "--config.export_best=true",
                        "--config.learning_rate=0.05"] + common + tiny + ["--config.eval_every=3"],
      # test_translate_script's: the run to resume, and bad input (a too-long line refused, an unknown model, a
      # draft whose tokenizer differs).
      "translate": ["launch/translate.py", f"--input={inputs}", f"--output={directory / 'out.txt'}",
                    "--gamma=2"] + models,
      "refused": ["launch/translate.py", f"--input={longer}", "--long_inputs=refuse"] + models,
      "unknown": ["launch/translate.py", "--target=no-such-model"],
      "differs": ["launch/translate.py", f"--target={directory / 't'}", f"--draft={directory / 'other_tok'}"]}
  runs = dict(zip(first_batch, run_scripts(list(first_batch.values()))))
  out = directory / "out.txt"
  runs["translate_lines"] = out.read_text().split("\n") if out.exists() else []  # before the resume appends
  # test_translate_script's resume of the "translate" run: a longer input, its too-long line truncated.
  second_batch = {"translate_resume": ["launch/translate.py", f"--input={longer}",
                                       f"--output={directory / 'out.txt'}", "--nocompare"] + models}
  if runs["first"].returncode == 0:
    shutil.copytree(root / "target" / "export", root / "first_export")
    # The continued target keeps the first's schedule (10 steps): its train program is the first's, compiled.
    second_batch.update({
        "second": target + [f"--workdir={root / 'target'}", "--config.train_steps=15"] + common + tiny,
        "continued": target + [f"--workdir={root / 'continued'}", f"--config.init_from={root / 'first_export'}",
                               "--config.train_steps=10"] + common + tiny,
        "draft": ["launch/train.py", "--config=configs/ende.py:draft", f"--workdir={root / 'draft'}",
                  f"--config.teacher={root / 'first_export'}", "--config.train_steps=5"] + common + tiny})
  runs.update(zip(second_batch, run_scripts(list(second_batch.values()))))
  return runs


def test_training_resumes_and_distils(tiny_setup, training_runs):
  root, _, _ = tiny_setup
  first = training_runs["first"]
  assert first.returncode == 0, first.stderr[-3000:]
  assert "step 10/10" in first.stdout and "eval step 10: dev loss" in first.stdout
  assert "dev BLEU" in first.stdout and "(greedy, 4 natural sentences)" in first.stdout
  # A second run with a longer schedule continues from the saved step instead of starting over.
  second = training_runs["second"]
  assert second.returncode == 0, second.stderr[-3000:]
  assert "resumed from step 10" in second.stdout and "step 15/15" in second.stdout
  assert "step 5/" not in second.stdout
  target = jaxspec.load(str(root / "target" / "export"))
  assert target.tokenizer is not None and target.config.d_model == 16
  # Continuing from a saved model (the first run's) in a new workdir starts from its weights, not from a random
  # init; a draft distils from it.
  cont, draft = training_runs["continued"], training_runs["draft"]
  assert cont.returncode == 0, cont.stderr[-3000:]
  first_ce = float(first.stdout.split("step 5/10")[1].split("| ce ")[1].split()[0])
  cont_ce = float(cont.stdout.split("step 5/10")[1].split("| ce ")[1].split()[0])
  assert cont_ce < first_ce
  assert draft.returncode == 0, draft.stderr[-3000:]
  assert " kl " in draft.stdout


def test_training_exports_the_best_dev_loss(tiny_setup, training_runs):
  root, _, _ = tiny_setup
  workdir = root / "best"
  res = training_runs["best"]
  assert res.returncode == 0, res.stderr[-3000:]
  evals = {int(line.split()[2].rstrip(":")): float(line.split("dev loss ")[1].split()[0])
           for line in res.stdout.splitlines() if line.startswith("eval step")}
  assert sorted(evals) == [3, 6, 9, 12]
  meta = json.loads((workdir / "export_meta.json").read_text())
  assert meta["step"] == min(evals, key=evals.get)  # the first evaluation with the lowest dev loss
  assert abs(meta["dev_loss"] - min(evals.values())) < 1e-3
  assert jaxspec.load(str(workdir / "export")).config.d_model == 16


def test_translate_script(translate_setup, training_runs):
  directory = translate_setup[0]
  out = directory / "out.txt"
  # Forked beside the first training runs (`training_runs`): the run to resume, and bad input (a too-long line
  # refused, an unknown model, a draft whose tokenizer differs).
  res, refused, unknown, differs = (training_runs[k] for k in ("translate", "refused", "unknown", "differs"))
  assert res.returncode == 0, res.stderr[-3000:]
  lines = training_runs["translate_lines"]
  assert len(lines) == 5 and lines[1] == ""  # one output line per input line, the empty one kept empty
  for key in ("alpha", "tokens per iteration", "acceptance per draft position", "speedup",
              "expected", "identical to plain greedy output: True"):
    assert key in res.stdout
  assert refused.returncode != 0 and "line 5 has" in refused.stderr
  assert "more than --max_input_length=16" in refused.stderr
  assert unknown.returncode != 0 and "Unknown model 'no-such-model'" in unknown.stderr
  assert differs.returncode != 0 and "tokenizer" in differs.stderr and "differs" in differs.stderr
  # Resuming: a run over a longer input appends only the new line, its too-long line truncated (the default).
  # (Forked with the second training runs, `training_runs`.)
  res = training_runs["translate_resume"]
  assert res.returncode == 0 and "resuming: 4 of 5" in res.stderr, res.stderr[-3000:]
  assert "line 5 has" in res.stderr and "truncated to 16" in res.stderr
  assert out.read_text().split("\n")[:4] == lines[:4] and len(out.read_text().split("\n")) == 6


def test_domains_of_pairs_and_distillation_sources():
  pairs = [Pair("a", "A", "deb trans-de-en (ding)"), Pair("b", "B", "doc:gimp-help"), Pair("c", "C", "kmail.mo"),
           Pair("d", "D", "ding"), Pair("e", "E", "distilled:doc:kde-help"), Pair("a", "A2", "deb gramps"),
           Pair("f", "F", "deb libbinding-tools")]
  assert [p.domain for p in pairs] == ["natural", "documentation", "software", "natural", "documentation",
                                       "software", "software"]
  assert [p.is_natural for p in pairs] == [True, False, False, True, False, False, False]
  assert Pair("x", "y", "distilled:deb trans-de-en (ding)").is_natural
  # Natural first, then documentation, then software; one pair per English text; capped.
  assert [p.en for p in distillation_sources(pairs, 10)] == ["a", "d", "b", "e", "c", "f"]
  assert [p.en for p in distillation_sources(pairs, 3)] == ["a", "d", "b"]
  assert [p.en for p in distillation_sources(pairs, 10, ("software",))] == ["c", "a", "f"]
  with pytest.raises(ValueError, match="unknown domain"):
    distillation_sources(pairs, 10, ("poetry",))
  assert length_buckets(96, spec="16,32,48,64,96") == [16, 32, 48, 64, 96]
  assert length_buckets(32, spec="16,64") == [16, 32]  # max_len last, nothing above it


def test_evaluation_scores_per_domain():
  from jaxspec.bench import quality
  pairs = [Pair(f"s{i}", f"Das ist Satz {i}.", src) for i, src in
           enumerate(["ding"] * 6 + ["doc:x"] * 3 + ["deb y"] * 4)]
  chosen = quality.select_pairs(pairs, limit_per_domain=2)
  assert [p.domain for p in chosen] == ["natural"] * 2 + ["documentation"] * 2 + ["software"] * 2
  assert quality.select_pairs(pairs, natural_only=True) == pairs[:6]
  refs = [p.de for p in chosen]
  hyps = refs[:2] + ["ganz anders"] * 2 + refs[4:]
  s = quality.scores(hyps, refs, np.array([p.domain for p in chosen]))
  assert s["bleu_natural"] == pytest.approx(100) and s["chrf_software"] == pytest.approx(100)
  assert s["bleu_documentation"] < 5 and s["chrf_documentation"] < 30 and 5 < s["bleu"] < 100


def _tiny_batch():
  cfg = t5.T5Config(vocab_size=20, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)
  params = t5.init_params(cfg, jax.random.key(0))
  inputs = jnp.asarray(np.random.RandomState(0).randint(2, 20, size=(4, 6)), jnp.int32)
  labels = jnp.asarray(np.random.RandomState(1).randint(2, 20, size=(4, 5)), jnp.int32)
  return cfg, params, inputs, labels


def test_dropout_is_training_only():
  cfg, params, inputs, labels = _tiny_batch()
  dec = steps.shift_right(labels, 0)
  plain = t5.forward(params, cfg, inputs, dec)
  key = jax.random.key(3)
  np.testing.assert_array_equal(plain, t5.forward(params, cfg, inputs, dec, dropout_rate=0.0, dropout_rng=key))
  np.testing.assert_array_equal(plain, t5.forward(params, cfg, inputs, dec, dropout_rate=0.3))  # no rng: none
  dropped = t5.forward(params, cfg, inputs, dec, dropout_rate=0.3, dropout_rng=key)
  assert not np.allclose(plain, dropped)
  np.testing.assert_array_equal(dropped, t5.forward(params, cfg, inputs, dec, dropout_rate=0.3, dropout_rng=key))
  assert not np.allclose(dropped, t5.forward(params, cfg, inputs, dec, dropout_rate=0.3,
                                             dropout_rng=jax.random.key(4)))
  # Decoding adds no random op unless a Dropout is passed.
  cache = t5.init_cache(params, cfg, inputs, 8)
  ops = lambda f: {str(e.primitive) for e in jax.make_jaxpr(f)(params, cache, dec[:, :2]).jaxpr.eqns}
  assert not any("random" in op or "threefry" in op for op in ops(lambda p, c, t: t5.decode(p, cfg, c, t)))
  from jaxspec.models.t5.model import Dropout
  assert any("random" in op or "threefry" in op
             for op in ops(lambda p, c, t: t5.decode(p, cfg, c, t, dropout=Dropout(0.1, key))))
  # In a train step, dropout changes the loss; evaluation (no dropout) is the same whatever the step's settings.
  opt = steps.make_optimizer(1e-3, 1, 10)
  ce = {}
  for rate in (0.0, 0.5):
    settings = steps.StepConfig(model=cfg, dropout_rate=rate)
    p = jax.tree.map(jnp.copy, params)
    _, _, m = steps.train_step(settings, opt, p, opt.init(p), inputs, labels, None, 7)
    ce[rate] = float(m["ce"])
  assert ce[0.0] != pytest.approx(ce[0.5], abs=1e-4)
  ref = steps.token_losses(plain, labels, 0)[0].sum(axis=1)
  np.testing.assert_allclose(steps.eval_step(cfg, params, inputs, labels)[0], ref, rtol=1e-5)
  assert ce[0.0] == pytest.approx(float(ref.sum() / (labels != 0).sum()), rel=1e-5)


def test_label_smoothing_mixed_precision_and_budget_schedule():
  cfg, params, inputs, labels = _tiny_batch()
  logits = t5.forward(params, cfg, inputs, steps.shift_right(labels, 0))
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, labels[..., None], -1).mean()
  loss, m = steps.loss_fn(params, cfg, inputs, labels, label_smoothing=0.2)
  assert float(m["ce"]) == pytest.approx(float(nll), rel=1e-5)  # the metric stays the plain cross-entropy
  assert float(loss) == pytest.approx(float(0.8 * nll - 0.2 * logp.mean()), rel=1e-5)
  settings = steps.StepConfig(model=cfg, compute_dtype="bfloat16", label_smoothing=0.1, dropout_rate=0.1)
  opt = steps.make_optimizer(1e-2, 2, None)
  state, first = opt.init(params), None
  for step in range(20):
    params, state, metrics = steps.train_step(settings, opt, params, state, inputs, labels, None, step)
    first = first if first is not None else float(metrics["ce"])
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))  # master weights stay float32
  assert float(metrics["ce"]) < first
  scales = [steps.budget_lr_scale(f) for f in (-1, 0, 0.25, 0.5, 1, 2)]
  assert scales[0] == scales[1] == pytest.approx(1) and scales[-1] == scales[-2] == pytest.approx(0.05)
  assert scales[1] > scales[2] > scales[3] > scales[4]
