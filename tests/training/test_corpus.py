"""The corpus builder on small synthetic inputs: sentence splitting, language check, filters, aligners, readers of
HTML and man pages, and the build's splits (documentation held out, nothing from the base dev/test in train)."""

import bz2
import collections
import json
import os
import subprocess
import sys

import pytest

from jaxspec.data.corpus import align, build, manpages, markup, sources, text
from jaxspec.data.ende import Pair, read_pairs, write_pairs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository

# Twelve translated paragraphs; each a different sentence so that none is a repeat of another.
PARAGRAPHS = [(f"The package number {i} installs the program on your system. You can remove version {i} again.",
               f"Das Paket Nummer {i} installiert das Programm auf Ihrem System. Sie können Version {i} wieder "
               "entfernen.") for i in range(12)]


def _html(paragraphs, lang, extra=""):
  body = "".join(f'<p class="para">{p}</p><pre>apt install foo{i}</pre>' for i, p in enumerate(paragraphs))
  return f'<html lang="{lang}"><head><title>t</title><script>var x = "Hallo";</script></head><body>{extra}' \
         f'{body}</body></html>'


def test_split_sentences_keeps_abbreviations_and_ordinals():
  assert text.split_sentences("Use a tool, e.g. Foo. It works.  Really? Yes!") == [
      "Use a tool, e.g. Foo.", "It works.", "Really?", "Yes!"]
  assert text.split_sentences("Am 1. Januar ist z. B. Ruhe. Dann nicht.") == ["Am 1. Januar ist z. B. Ruhe.",
                                                                              "Dann nicht."]
  assert text.split_sentences("see version 2.3. done") == ["see version 2.3. done"]  # no capital: no new sentence


def test_language_check():
  assert text.looks_english("This is the file that you want.")
  assert not text.looks_german("This is the file that you want.")
  assert text.looks_german("Das ist die Datei, die Sie öffnen möchten.")
  assert not text.looks_english("Das ist die Datei, die Sie öffnen möchten.")
  assert not text.looks_english("Hello World") and not text.looks_german("Hello World")  # no evidence either way


def test_prose_filter_reasons():
  f = text.ProseFilter()
  good = ("This command shows the files of the package.", "Dieser Befehl zeigt die Dateien des Pakets an.")
  assert f.reason(*good) is None
  assert f.reason("Too short.", "Zu kurz.") == "length"
  assert f.reason(good[0], "Dieser Befehl zeigt die Dateien des Pakets an, und noch sehr viel mehr Text, der in "
                  "der englischen Fassung gar nicht steht, weil er anderswo hingehört.") == "ratio"
  assert f.reason(good[0], good[0]) == "untranslated"
  assert f.reason("Run <code>ls</code> to see the files here.", "Führen Sie <code>ls</code> aus für die Dateien.") \
      == "markup"
  assert f.reason("this command shows the files of the package", good[1]) == "not_a_sentence"
  assert f.reason("The package has 3 files and the tool needs 4.", "Das Paket hat 3 Dateien und es braucht 5.") \
      == "numbers"
  assert f.reason("Dieser Befehl zeigt die Dateien des Pakets an.", good[1][::-1].capitalize() + ".") in (
      "untranslated", "language", "markup")
  assert f.reason("It is what you need to read before you start.", "This is what you have to do with it.") \
      == "language"


def test_english_key_ignores_case_and_punctuation():
  assert text.english_key("Open the File!") == text.english_key("open the file") != text.english_key("Open a file")


def test_align_blocks_skips_inserted_blocks_and_checks_anchors():
  en = [align.Block("h1", "Title one"), align.Block("p", "First paragraph here."),
        align.Block("pre:ls -l", "ls -l", verbatim=True),
        align.Block("p", "Run ls now.", anchors=frozenset({"ls"})), align.Block("p", "Last one here.")]
  de = [align.Block("h1", "Titel eins"), align.Block("p", "Erster Absatz hier."),
        align.Block("div.note", "Hinweis des Übersetzers."),  # only in the translation
        align.Block("pre:ls -l", "ls -l", verbatim=True),
        align.Block("p", "Führen Sie dir aus.", anchors=frozenset({"dir"})),  # different literal: dropped
        align.Block("p", "Der letzte hier.")]
  assert align.align_blocks(en, de) == [("Title one", "Titel eins"), ("First paragraph here.", "Erster Absatz hier."),
                                        ("Last one here.", "Der letzte hier.")]


def test_align_blocks_uses_shared_ids():
  en = [align.Block("p", "Alpha text.", "a1"), align.Block("p", "Beta text.", "b2")]
  de = [align.Block("p", "Beta Text.", "b2")]  # the first paragraph is missing in the translation
  assert align.align_blocks(en, de) == [("Beta text.", "Beta Text.")]


def test_align_sentences_one_to_one_and_merges():
  assert align.align_sentences("One here. Two there.", "Eins hier. Zwei dort.") == [("One here.", "Eins hier."),
                                                                                 ("Two there.", "Zwei dort.")]
  en = "The file is opened by the program. It is then read from start to end. Nothing else happens."
  de = "Die Datei wird vom Programm geöffnet und dann von Anfang bis Ende gelesen. Sonst passiert nichts."
  assert align.align_sentences(en, de) == [
      ("The file is opened by the program. It is then read from start to end.",
       "Die Datei wird vom Programm geöffnet und dann von Anfang bis Ende gelesen."),
      ("Nothing else happens.", "Sonst passiert nichts.")]


def test_markup_blocks(tmp_path):
  path = tmp_path / "a.html"
  path.write_text('<html><head><title>x</title></head><body><h1 id="top">Head</h1><p>One <code>ls</code> two'
                  '<p>Unclosed next<ul><li>Item <b>bold</b></li></ul><pre>code  here</pre>'
                  '<script>ignored()</script></body></html>')
  blocks = markup.read_blocks(str(path))
  assert [(b.tag, b.text, b.ident) for b in blocks] == [
      ("h1", "Head", "top"), ("p", "One ls two", ""), ("p", "Unclosed next", ""), ("li", "Item bold", ""),
      ("pre:code here", "code here", "")]
  assert blocks[1].anchors == {"ls"} and blocks[4].verbatim
  page = tmp_path / "a.page"  # Mallard
  page.write_text('<page><info><credit><name>Ann</name></credit><desc>d</desc></info><title>T</title><p>Press '
                  '<keyseq><key>Ctrl</key><key>H</key></keyseq> in <guiseq><gui>Edit</gui><gui>Copy</gui></guiseq>.'
                  '</p><code>ls -l</code></page>')
  assert [(b.tag, b.text) for b in markup.read_blocks(str(page))] == [
      ("desc", "d"), ("title", "T"), ("p", "Press Ctrl+H in Edit ▸ Copy."), ("pre:ls -l", "ls -l")]
  with bz2.open(tmp_path / "index.cache.bz2", "wt") as f:  # KDE's rendered handbooks
    f.write(path.read_text())
  assert markup.read_blocks(str(tmp_path / "index.cache.bz2")) == blocks


def test_man_page_blocks(tmp_path):
  path = tmp_path / "ls.1"
  path.write_text('.\\" comment\n.TH LS 1\n.SH NAME\nls \\- list\n.SH DESCRIPTION\n.PP\nList \\fBfiles\\fR '
                  'here.\nSecond line.\n.TP\n\\fB\\-a\\fR, \\fB\\-\\-all\\fR\nShow all.\n.nf\ncode \\- x\n.fi\n'
                  '.BR ls (1)\n')
  blocks = manpages.read_blocks(str(path))
  assert [(b.tag, b.text) for b in blocks] == [
      ("SH", "NAME"), ("SH", "ls - list"), ("SH", "DESCRIPTION"), ("PP", "List files here. Second line."),
      ("tag:-a --all", "-a, --all"), ("TP", "Show all."), ("pre:code - x", "code - x"), ("TP", "ls(1)")]


def _doc_root(tmp_path, extra_de=""):
  root = tmp_path / "root"
  d = root / "usr" / "share" / "debian-reference"
  d.mkdir(parents=True)
  (d / "ch01.en.html").write_text(_html([en for en, _ in PARAGRAPHS], "en"))
  (d / "ch01.de.html").write_text(_html([de for _, de in PARAGRAPHS], "de", extra_de))
  return root


def test_document_pairs_from_a_source(tmp_path):
  root = _doc_root(tmp_path, extra_de="<p>Nur in der Übersetzung steht dieser Absatz hier.</p>")
  source = next(s for s in sources.SOURCES if s.name == "debian-reference")
  files = sources.document_files(source, [str(root)])
  assert [os.path.basename(p) for pair in files for p in pair] == ["ch01.en.html", "ch01.de.html"]
  dropped = collections.Counter()
  pairs, aligned = sources.document_pairs(source, *files[0], text.ProseFilter(), dropped)
  assert aligned == 24 and len(pairs) == 24 and not dropped
  assert pairs[0] == Pair(PARAGRAPHS[0][0].split(". ")[0] + ".", PARAGRAPHS[0][1].split(". ")[0] + ".",
                          "doc:debian-reference")


def test_build_on_a_base_keeps_its_dev_test_and_holds_documentation_out(tmp_path):
  root = _doc_root(tmp_path)
  base = tmp_path / "base"
  base.mkdir()
  leaked = PARAGRAPHS[3][0].split(". ")[0] + "."  # a documentation sentence that is also in the base dev set
  write_pairs(str(base / "train.tsv.gz"), [Pair("The dog is big.", "Der Hund ist groß.", "ding")])
  write_pairs(str(base / "dev.tsv"), [Pair(leaked.upper(), "x", "ding")])
  write_pairs(str(base / "test.tsv"), [Pair("The cat sleeps.", "Die Katze schläft.", "ding")])
  out = tmp_path / "out"
  report = build.build(str(out), [], "/nonexistent", [str(root)], ["debian-reference"], str(base), dev_size=1,
                       doc_dev_size=3, seed=0)
  train, dev_doc, test_doc = (read_pairs(str(out / n)) for n in ("train.tsv.gz", "dev_doc.tsv", "test_doc.tsv"))
  assert read_pairs(str(out / "dev.tsv")) == [Pair(leaked.upper(), "x", "ding")]
  assert len(dev_doc) == len(test_doc) == 3
  held = {p.en for p in dev_doc + test_doc}
  assert not held & {p.en for p in train} and leaked not in {p.en for p in train + dev_doc + test_doc}
  assert len(train) == 1 + 24 - 1 - 6 and train[0].source == "ding"
  assert report["sources"]["doc:debian-reference"] == {"read": 24, "filtered": 24, "new": 23, "dropped": {}}
  assert json.loads((out / "counts.json").read_text())["splits"]["train.tsv.gz"] == len(train)


def test_build_corpus_script_with_documentation(tmp_path):
  root = _doc_root(tmp_path)
  out = tmp_path / "out"
  res = subprocess.run([sys.executable, "launch/build_corpus.py", f"--output_dir={out}", "--locale_roots=",
                        "--ding=/nonexistent", f"--doc_roots={root}", "--doc_dev_size=2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode != 0 and "catalog/dictionary pairs" in res.stderr  # no catalogs and no base: a clear error
  res = subprocess.run([sys.executable, "launch/build_corpus.py", f"--output_dir={out}", "--docs=nope",
                        f"--doc_roots={root}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert res.returncode != 0 and "unknown ['nope']" in res.stderr


@pytest.mark.parametrize("en,de,keep", [("Open the file", "Datei öffnen", True), ("%s files", "%s Dateien", False),
                                        ("Open the file", "Open the file", False),
                                        ("Save all the files of this project", "Save all the files of the project",
                                         False)])
def test_string_filter(en, de, keep):
  assert (text.StringFilter().reason(en, de) is None) == keep
