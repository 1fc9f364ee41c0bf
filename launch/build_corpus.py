r"""Rebuilds an EN-DE corpus from German translations shipped by installed packages.

Sources: gettext catalogs (`<root>/de/LC_MESSAGES/*.mo`: English msgid -> German msgstr) under the given locale
roots, and, when installed (Debian package `trans-de-en`), example sentences of the Ding dictionary
(/usr/share/trans/de-en, lines "German :: English"). Writes train/dev/test TSVs, split disjointly by English text.

    python launch/build_corpus.py --output_dir=/tmp/ende
    python launch/build_corpus.py --locale_roots=/usr/share/locale,/usr/lib/python3/dist-packages --dev_size=500
"""

import gettext
import glob
import os
import re

import numpy as np
from absl import app, flags, logging

from jaxspec.data.ende import Pair, write_pairs

_OUTPUT = flags.DEFINE_string("output_dir", "/tmp/ende", "Where train.tsv.gz, dev.tsv and test.tsv go.")
_ROOTS = flags.DEFINE_list("locale_roots", ["/usr/share/locale"], "Directories searched for de/LC_MESSAGES/*.mo.")
_DING = flags.DEFINE_string("ding", "/usr/share/trans/de-en", "Ding dictionary file (skipped when missing).")
_DEV = flags.DEFINE_integer("dev_size", 2000, "Pairs in each of dev and test.")
_SEED = flags.DEFINE_integer("seed", 0, "Split seed.")

_MNEMONIC = re.compile(r"(?<!\w)[_&~](?=\w)|(?<=\w)[_&~](?=\w)")


def clean(text: str) -> str:
  """Drops GTK/Qt/LibreOffice mnemonic markers and collapses whitespace."""
  return " ".join(_MNEMONIC.sub("", text).split())


def catalog_pairs(root: str) -> list[Pair]:
  pairs = []
  for path in sorted(glob.glob(os.path.join(root, "**", "de", "LC_MESSAGES", "*.mo"), recursive=True)):
    try:
      with open(path, "rb") as f:
        catalog = gettext.GNUTranslations(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
      logging.warning("skipping unreadable catalog %s: %s", path, e)
      continue
    for msgid, msgstr in catalog._catalog.items():  # pylint: disable=protected-access
      if not isinstance(msgid, str) or not msgid or not msgstr or "\x00" in msgid:
        continue
      en, de = clean(msgid), clean(msgstr)
      if 2 <= len(en.split()) <= 40 and en != de and "%" not in en and "{" not in en:
        pairs.append(Pair(en, de, os.path.basename(path)))
  return pairs


def ding_pairs(path: str) -> list[Pair]:
  if not os.path.exists(path):
    return []
  pairs = []
  with open(path, encoding="utf-8", errors="ignore") as f:
    for line in f:
      if "::" not in line or line.startswith("#"):
        continue
      de, en = (s.split("|")[0].strip() for s in line.split("::", 1))
      if en[:1].isupper() and en[-1:] in ".!?" and len(en.split()) >= 3:
        pairs.append(Pair(en, de, "ding"))
  return pairs


def main(argv):
  del argv
  pairs = [p for root in _ROOTS.value for p in catalog_pairs(root)] + ding_pairs(_DING.value)
  by_en = {}
  for p in pairs:
    by_en.setdefault(p.en, p)  # one German per English text: splits stay disjoint by English
  unique = list(by_en.values())
  rng = np.random.RandomState(_SEED.value)
  order = rng.permutation(len(unique))
  n = _DEV.value
  if len(unique) < 3 * n:
    raise SystemExit(f"only {len(unique)} distinct pairs found: lower --dev_size or add --locale_roots.")
  os.makedirs(_OUTPUT.value, exist_ok=True)
  write_pairs(os.path.join(_OUTPUT.value, "dev.tsv"), [unique[i] for i in order[:n]])
  write_pairs(os.path.join(_OUTPUT.value, "test.tsv"), [unique[i] for i in order[n:2 * n]])
  write_pairs(os.path.join(_OUTPUT.value, "train.tsv.gz"), [unique[i] for i in order[2 * n:]])
  print(f"{len(unique)} pairs ({len(pairs)} before removing repeated English) -> {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
