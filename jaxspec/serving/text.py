"""Tokens to text deltas for one request: incremental detokenization and stop strings, on the host.

    out = TextStream(tokenizer, stops=("\\n\\n",))
    delta = out.add([17, 4, 912])   # the text these tokens complete ('' while a character or a stop is pending)
    out.stopped                     # True once a stop string appeared: the text ends before it
    delta = out.flush()             # at the end: whatever was held back

The text so far is `tokenizer.decode(all ids)` (so the concatenated deltas equal the decode of the whole output,
as `jaxspec.generate`'s text is made); a tail ending in U+FFFD (a multi-byte character not complete yet) is held
back, as is any tail that could be the start of a stop string. Decoding the whole output each time costs O(n) per
step, fine for the server's max_tokens; a request's text is cut at the first stop string (the stop string itself
is not returned, as OpenAI does).
"""

from __future__ import annotations

from typing import Sequence


class TextStream:
  """Incremental text of one request's tokens, with stop strings applied."""

  def __init__(self, tokenizer, stops: Sequence[str] = ()):
    self.tokenizer, self.stops = tokenizer, tuple(stops)
    self.ids: list[int] = []
    self.sent = ""      # text handed out so far
    self.stopped = False

  def _text(self) -> str:
    return self.tokenizer.decode(self.ids)

  def _cut(self, text: str, final: bool) -> str:
    """The new text that may go out now: up to a stop string (then stopped), else all but a pending tail."""
    new = text[len(self.sent):] if text.startswith(self.sent) else ""
    if self.stops:
      # A stop string may straddle what was sent and what is new: search from where it could begin.
      start = max(0, len(self.sent) - max(len(s) for s in self.stops) + 1)
      window = text[start:]
      hits = [window.find(s) for s in self.stops]
      hits = [h for h in hits if h >= 0]
      if hits:
        end = start + min(hits)
        self.stopped = True
        return text[len(self.sent):end] if end > len(self.sent) else ""
      if not final:
        hold = 0
        for s in self.stops:  # the longest tail of text that begins a stop string
          for k in range(min(len(s) - 1, len(new)), hold, -1):
            if text.endswith(s[:k]):
              hold = k
              break
        new = new[:len(new) - hold]
    if not final:
      while new.endswith("\ufffd"):
        new = new[:-1]
    return new

  def add(self, ids: Sequence[int]) -> str:
    """Appends tokens; returns the text delta that may go out now ('' once stopped)."""
    if self.stopped:
      return ""
    self.ids.extend(int(i) for i in ids)
    delta = self._cut(self._text(), final=False)
    self.sent += delta
    return delta

  def flush(self) -> str:
    """The text held back at the end (a pending stop-string prefix that never completed)."""
    if self.stopped:
      return ""
    delta = self._cut(self._text(), final=True)
    self.sent += delta
    return delta
