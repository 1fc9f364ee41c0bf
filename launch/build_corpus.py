r"""Rebuilds the EN-DE corpus from German translations shipped by installed (or unpacked) packages.

Sources (jaxspec/data/corpus, docs/corpus.md): gettext catalogs (`<root>/**/de/LC_MESSAGES/*.mo`) under
--locale_roots; example sentences of the Ding dictionary (--ding, Debian package `trans-de-en`); and, with
--doc_roots, documentation shipped in German and English (sources.SOURCES: Debian reference, handbook,
installation guide, GIMP/LibreOffice/GNOME help, LilyPond, German man pages, ...), aligned by structure, then by
sentence. Writes train.tsv.gz, dev.tsv, test.tsv (+ dev_doc.tsv, test_doc.tsv with documentation) and counts.json.

    python launch/build_corpus.py --output_dir=corpus
    python launch/build_corpus.py --output_dir=/work/corpus --base_dir=../shared/data/ende \
      --locale_roots=/usr/share/locale,/work/corpus_src/mo --doc_roots=/work/corpus_src/root,/
"""

from absl import app, flags

from jaxspec.data.corpus import build, sources

_OUTPUT = flags.DEFINE_string("output_dir", "corpus", "Where the TSV files and counts.json go.")
_ROOTS = flags.DEFINE_list("locale_roots", ["/usr/share/locale"], "Directories searched for de/LC_MESSAGES/*.mo.")
_DING = flags.DEFINE_string("ding", "/usr/share/trans/de-en", "Ding dictionary file (skipped when missing).")
_DOC_ROOTS = flags.DEFINE_list("doc_roots", [], "Filesystem roots holding the documentation packages' files "
                               "(usr/share/...): / for installed packages, a `dpkg -x` target for unpacked ones. "
                               "Empty: no documentation.")
_DOCS = flags.DEFINE_list("docs", None, "Only these documentation sources (names in sources.SOURCES).")
_BASE = flags.DEFINE_string("base_dir", None, "A corpus whose dev/test are kept and whose train is extended.")
_DEV = flags.DEFINE_integer("dev_size", 2000, "Pairs in each of dev and test (without --base_dir).")
_DOC_DEV = flags.DEFINE_integer("doc_dev_size", 500, "Documentation pairs in each of dev_doc and test_doc.")
_SEED = flags.DEFINE_integer("seed", 0, "Split seed.")


def main(argv):
  del argv
  names = {s.name for s in sources.SOURCES}
  if _DOCS.value and set(_DOCS.value) - names:
    raise app.UsageError(f"--docs: unknown {sorted(set(_DOCS.value) - names)}; known: {sorted(names)}.")
  try:
    report = build.build(_OUTPUT.value, _ROOTS.value, _DING.value, _DOC_ROOTS.value, _DOCS.value, _BASE.value,
                         _DEV.value, _DOC_DEV.value, _SEED.value)
  except build.CorpusError as e:
    raise SystemExit(f"build_corpus: {e}") from None
  print(f"{'source':40s} {'read':>8s} {'filtered':>9s} {'new':>8s}")
  for name, c in report["sources"].items():
    print(f"{name:40s} {c['read']:8d} {c['filtered']:9d} {c['new']:8d}")
  print(", ".join(f"{k}: {v}" for k, v in report["splits"].items()), "->", _OUTPUT.value)
  print("train by domain:", report["train_by_domain"])


if __name__ == "__main__":
  app.run(main)
