"""Documentation shipped in German and English by Debian packages, and the sentence pairs aligned from it.

`SOURCES` is the table of document-aligned sources: for each, a glob of the German files under a root and the
substitution that gives the English file's path (searched under every root, so German pages unpacked in one
directory can meet English ones installed under /). `document_pairs` reads both files (markup.py or
manpages.py), aligns blocks then sentences (align.py) and filters the sentence pairs (text.ProseFilter).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re

from jaxspec.data.corpus import manpages, markup
from jaxspec.data.corpus.align import align_blocks, align_sentences
from jaxspec.data.corpus.text import ProseFilter
from jaxspec.data.ende import Pair


@dataclasses.dataclass(frozen=True)
class DocSource:
  name: str  # the pairs' source column is "doc:<name>"
  packages: str  # Debian packages holding the German and the English files
  german: str  # glob relative to a root; several separated by spaces
  english: tuple[str, str]  # (pattern, replacement) turning a German path into the English one
  licence: str  # from the packages' /usr/share/doc/<package>/copyright
  kind: str = "markup"  # "markup" (HTML/XML) or "man" (roff)


SOURCES = (
    DocSource("debian-reference", "debian-reference-de, debian-reference-en", "usr/share/debian-reference/*.de.html",
              (r"\.de\.html$", ".en.html"), "GPL-2+"),
    DocSource("developers-reference", "developers-reference-de, developers-reference",
              "usr/share/developers-reference/de/*.html", ("/developers-reference/de/", "/developers-reference/"),
              "MIT-style (Expat)"),
    DocSource("debian-faq", "debian-faq-de, debian-faq", "usr/share/doc/debian/FAQ/de/*.de.html",
              (r"/FAQ/de/(.*)\.de\.html$", r"/FAQ/\1.en.html"), "GPL-2+"),
    DocSource("maint-guide", "maint-guide-de, maint-guide", "usr/share/doc/maint-guide-de/html/*.de.html",
              (r"maint-guide-de/html/(.*)\.de\.html$", r"maint-guide/html/\1.en.html"), "MIT-style (Expat)"),
    DocSource("debian-history", "debian-history", "usr/share/doc/debian-history/docs/*.de.html",
              (r"\.de\.html$", ".en.html"), "GPL-2+"),
    DocSource("debian-edu-doc", "debian-edu-doc-de, debian-edu-doc-en",
              "usr/share/doc/debian-edu-doc-de/debian-edu-bookworm-manual.html", ("-doc-de/", "-doc-en/"),
              "GPL-2+"),
    DocSource("debian-handbook", "debian-handbook", "usr/share/doc/debian-handbook/html/de-DE/*.html",
              ("/de-DE/", "/en-US/"), "GPL-2+ or CC-BY-SA-3.0"),
    DocSource("installation-guide", "installation-guide-amd64", "usr/share/doc/installation-guide-amd64/de/*.html",
              ("/de/", "/en/"), "GPL-2+"),
    DocSource("kicad-doc", "kicad-doc-de, kicad-doc-en", "usr/share/doc/kicad/help/de/*.html", ("/de/", "/en/"),
              "GPL-3+ or CC-BY-3.0+"),
    DocSource("gimp-help", "gimp-help-de, gimp-help-en", "usr/share/gimp/2.0/help/de/**/*.html",
              ("/help/de/", "/help/en/"), "GFDL-1.2+"),
    DocSource("lilypond-doc", "lilypond-doc-html-de, lilypond-doc-html",
              "usr/share/doc/lilypond/html/Documentation/**/*.de.html", (r"\.de\.html$", ".html"), "GFDL-1.3+"),
    DocSource("linuxcnc-doc", "linuxcnc-doc-de, linuxcnc-doc-en", "usr/share/doc/linuxcnc/gcode_de.html",
              ("gcode_de.html", "gcode.html"), "GPL-2 and LGPL-2.1"),
    DocSource("libreoffice-help", "libreoffice-help-de, libreoffice-help-en-us",
              "usr/share/libreoffice/help/de/text/**/*.html", ("/help/de/", "/help/en-US/"), "MPL-2.0"),
    DocSource("gnome-help", "gnome-user-docs, gnome-devel-docs and the help of GNOME/MATE applications (Mallard "
              "pages, DocBook)", "usr/share/help/de/*/*.page usr/share/help/de/*/*.xml", ("/help/de/", "/help/C/"),
              "CC-BY-SA-3.0, CC-BY-3.0, GFDL-1.1+ (per application)"),
    DocSource("kde-help", "KDE applications' handbooks (dolphin, kate5-data, kmail, okular, ...)",
              "usr/share/doc/HTML/de/**/index.cache.bz2", ("/HTML/de/", "/HTML/en/"), "GFDL-1.2+ (KDE handbooks)"),
    DocSource("manpages-de", "manpages-de (German), manpages, manpages-dev and each command's package (English)",
              "usr/share/man/de/man*/*", ("/man/de/", "/man/"), "GPL-3+ (translations); English pages: their "
              "packages' licences", kind="man"),
)


def document_files(source: DocSource, roots: list[str]) -> list[tuple[str, str]]:
  """(English path, German path) of the source's documents found under the roots; one per German path.

  German paths are looked for under each root; the English counterpart under the same root first, then the others.
  """
  pattern, replacement = source.english
  found, seen = [], set()
  for root in roots:
    for de in sorted(p for g in source.german.split() for p in glob.glob(os.path.join(root, g), recursive=True)):
      relative = os.path.relpath(de, root)
      en_relative = re.sub(pattern, replacement, relative)
      if relative in seen or en_relative == relative or os.path.islink(de):
        continue
      for en_root in [root] + [r for r in roots if r != root]:
        if os.path.isfile(os.path.join(en_root, en_relative)):
          found.append((os.path.join(en_root, en_relative), de))
          seen.add(relative)
          break
  return found


def document_pairs(source: DocSource, en_path: str, de_path: str, prose: ProseFilter,
                   dropped: collections.Counter) -> tuple[list[Pair], int]:
  """Filtered sentence pairs of one English/German document pair, and how many aligned pairs it gave before
  filtering. `dropped` counts the filtered-out pairs by reason (text.ProseFilter.reason)."""
  reader = manpages.read_blocks if source.kind == "man" else markup.read_blocks
  en_blocks, de_blocks = reader(en_path), reader(de_path)
  kept, aligned = [], 0
  for en_block, de_block in align_blocks(en_blocks, de_blocks):
    for en, de in align_sentences(en_block, de_block):
      aligned += 1
      reason = prose.reason(en, de)
      if reason is None:
        kept.append(Pair(en, de, f"doc:{source.name}"))
      else:
        dropped[reason] += 1
  return kept, aligned
