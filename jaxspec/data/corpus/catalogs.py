"""Software strings from German gettext catalogs and example sentences of the Ding dictionary.

Catalogs: `<root>/**/de/LC_MESSAGES/*.mo` (English msgid -> German msgstr), read with gettext.GNUTranslations;
GTK/Qt/LibreOffice mnemonic markers (`_`, `&`, `~`) removed. Ding (Debian package `trans-de-en`,
/usr/share/trans/de-en): lines "German :: English", alternatives separated by " | "; kept where the English is a
capitalised sentence of 3+ words ending in . ! or ?, with the first alternative of each side.
"""

from __future__ import annotations

import gettext
import glob
import os
import re

from absl import logging

from jaxspec.data.ende import Pair

_MNEMONIC = re.compile(r"(?<!\w)[_&~](?=\w)|(?<=\w)[_&~](?=\w)")


def clean(text: str) -> str:
  """Drops GTK/Qt/LibreOffice mnemonic markers and collapses whitespace."""
  return " ".join(_MNEMONIC.sub("", text).split())


def catalog_files(root: str) -> list[str]:
  return sorted(glob.glob(os.path.join(root, "**", "de", "LC_MESSAGES", "*.mo"), recursive=True))


def catalog_pairs(path: str) -> list[Pair]:
  """All (msgid, msgstr) pairs of one .mo file with a non-empty translation, cleaned; plural forms skipped,
  message contexts dropped.

  The source column is the file name (as `gimp20.mo`). An unreadable file gives [] and a warning.
  """
  try:
    with open(path, "rb") as f:
      catalog = gettext.GNUTranslations(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    logging.warning("skipping unreadable catalog %s: %s", path, e)
    return []
  pairs = []
  for msgid, msgstr in catalog._catalog.items():  # pylint: disable=protected-access
    if not isinstance(msgid, str) or not msgid or not msgstr or "\x00" in msgid:
      continue
    msgid = msgid.split("\x04")[-1]  # "context\x04text"
    pairs.append(Pair(clean(msgid), clean(msgstr), os.path.basename(path)))
  return pairs


def ding_pairs(path: str) -> list[Pair]:
  """Example sentences of the Ding dictionary file; [] when the file does not exist."""
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
