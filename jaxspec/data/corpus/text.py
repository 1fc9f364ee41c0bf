"""Sentence splitting, a cheap English/German language check and the filters every corpus pair goes through.

Everything here works on plain strings; readers of documents and catalogs (markup.py, manpages.py, catalogs.py)
produce the strings, align.py pairs them.
"""

from __future__ import annotations

import dataclasses
import re

# Function words that occur in one language only (words shared by both, as "in", "an", "so", "was", "will",
# "die", "man", "also", are left out so that they count for neither).
_EN_WORDS = frozenset("""the and is are of to that this it with for be not can you or by from on as which should if
  have has were your their they these those there what when where been would could does do into than then its only
  such any each other more most must may use used using how why who about after before between through""".split())
_DE_WORDS = frozenset("""der das und ist nicht ein eine einen einem einer eines dem den des zu mit auf für von im sie
  es sich werden wird wenn oder auch kann können sind bei aus nach als wie über dass daß noch nur diese dieser dieses
  haben hat wurde wurden mehr durch um unter zum zur ihr ihre ihren sein seine kein keine muss müssen soll sollte
  sollten wir ich du er vom beim bis dann hier alle jede jeder jedes welche welcher werden damit dafür sowie""".split())
_WORD = re.compile(r"[A-Za-zÄÖÜäöüß]+")
_UMLAUT = re.compile(r"[ÄÖÜäöüß]")

# Tokens before a full stop that do not end a sentence ("e.g.", "z. B.", "Nr. 5", "1. Januar").
_ABBREVIATIONS = frozenset("""e.g i.e etc vs cf al approx resp no nos vol fig figs mr mrs ms dr st ca bzw usw vgl evtl
  ggf inkl bspw sog nr abb abs bd ff zb dh ua uvm s.o s.u z.b d.h u.a u.ä o.ä z.t i.d.r max min""".split())
_BOUNDARY = re.compile(r"""[.!?]+["'”“»«)\]]*\s+(?=["'„“»«(\[]?[A-ZÄÖÜ0-9])""")
_MARKUP = re.compile(r"[<>{}\\|`\ufffd\x00-\x1f\x7f]|&[a-z]+;|\$\(|\*\*|__|::|=>|\[\[")
_CONTROL = re.compile(r"[\ufffd\x00-\x1f\x7f]")
_NUMBER = re.compile(r"\d+")
_END = re.compile(r"""[.!?:]["'”“»«)]*$""")


def squash(text: str) -> str:
  """Collapses whitespace (newlines, tabs, non-breaking spaces) to single spaces."""
  return " ".join(text.replace("\u00a0", " ").replace("\u00ad", "").split())


def split_sentences(text: str) -> list[str]:
  """Splits a paragraph after . ! ? followed by a capital or digit, except after abbreviations and ordinals."""
  text = squash(text)
  out, start = [], 0
  for m in _BOUNDARY.finditer(text):
    words = text[start:m.start() + 1].split()
    last = words[-1].strip("(\"'„“").rstrip(".").lower() if words else ""
    if text[m.start()] == "." and (last in _ABBREVIATIONS or len(last) <= 1 or last.isdigit()):
      continue
    out.append(text[start:m.end()].strip())
    start = m.end()
  tail = text[start:].strip()
  return out + ([tail] if tail else [])


def language_scores(text: str) -> tuple[int, int]:
  """(English evidence, German evidence): function words of each language; umlauts and ß count for German."""
  words = [w.lower() for w in _WORD.findall(text)]
  return sum(w in _EN_WORDS for w in words), sum(w in _DE_WORDS for w in words) + len(_UMLAUT.findall(text))


def looks_english(text: str) -> bool:
  en, de = language_scores(text)
  return en >= 1 and en > de


def looks_german(text: str) -> bool:
  en, de = language_scores(text)
  return de >= 1 and de > en


def english_key(text: str) -> str:
  """What two English texts must share to count as the same sentence: lowercase letters and digits."""
  return " ".join(re.findall(r"[a-z0-9äöüß]+", text.lower()))


def _numbers(text: str) -> list[str]:
  return sorted(_NUMBER.findall(text))


def _untranslated(en: str, de: str) -> bool:
  """Most of the German side's longer words also occur in the English side (a copy, not a translation)."""
  en_words = {w.lower() for w in _WORD.findall(en)}
  de_words = [w.lower() for w in _WORD.findall(de) if len(w) > 3]
  return bool(de_words) and sum(w in en_words for w in de_words) > 0.6 * len(de_words)


@dataclasses.dataclass(frozen=True)
class ProseFilter:
  """Keeps sentence pairs that look like natural, translated prose (documentation)."""
  min_words: int = 4
  max_words: int = 80
  min_ratio: float = 0.6  # len(de) / len(en) in characters; German runs about 1.1 to 1.3 times longer
  max_ratio: float = 2.0

  def reason(self, en: str, de: str) -> str | None:
    """Why the pair is dropped (a short name used in the counts), or None to keep it."""
    n = len(en.split())
    if not self.min_words <= n <= self.max_words or len(de.split()) > 1.6 * self.max_words:
      return "length"
    if not self.min_ratio <= len(de) / len(en) <= self.max_ratio:
      return "ratio"
    if en.casefold() == de.casefold() or _untranslated(en, de):
      return "untranslated"
    if _MARKUP.search(en) or _MARKUP.search(de) or _letter_share(en) < 0.7 or _letter_share(de) < 0.7:
      return "markup"
    if not (en[0].isupper() or en[0] in "\"'“(") or not _END.search(en) or not _END.search(de):
      return "not_a_sentence"
    if _numbers(en) != _numbers(de):
      return "numbers"
    if not looks_english(en) or not looks_german(de):
      return "language"
    return None


@dataclasses.dataclass(frozen=True)
class StringFilter:
  """Keeps software-string pairs from message catalogs: short, often without function words, so the language
  check only drops German sides that read as English."""
  min_words: int = 2
  max_words: int = 40

  def reason(self, en: str, de: str) -> str | None:
    if not self.min_words <= len(en.split()) <= self.max_words or not de:
      return "length"
    if en == de:
      return "untranslated"
    if "%" in en or "{" in en or "<" in en or _CONTROL.search(en + de):
      return "markup"
    if not 0.3 <= len(de) / len(en) <= 3.5:
      return "ratio"
    if _numbers(en) != _numbers(de):
      return "numbers"
    en_score, de_score = language_scores(de)
    if en_score >= 2 and en_score > de_score:
      return "language"
    return None


def _letter_share(text: str) -> float:
  """Share of letters among the non-space characters."""
  chars = [c for c in text if not c.isspace()]
  return sum(c.isalpha() for c in chars) / max(1, len(chars))
