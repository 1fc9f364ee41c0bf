"""The load table: which draft length (or tree, or none) the slot engine runs for how many active slots.

    table = SpeculationTable((TableEntry(max_active=1, gamma=5), TableEntry(max_active=8, gamma=2),
                              TableEntry(max_active=64, gamma=0)))   # gamma 0: plain decoding
    table.choose(3)    # TableEntry(max_active=8, gamma=2)
    SpeculationTable.from_json(table.to_json()) == table
    SpeculationTable.read("table.json")   # launch/serve.py --speculation_table: a file, every entry checked

Entry i covers active-slot counts in (entries[i-1].max_active, entries[i].max_active]; the last entry also covers
every count above its max_active. The engine compiles one step program per distinct entry (and sampling mode),
all over one state layout: the caches are allocated for the largest gamma / tree of the table. The tuner measures
such a table (`jaxspec.bench.tune.speculation_table`).

Every entry gets the checks the --gamma / --tree flags get when it is made (from code or from a file): gamma in
[0, MAX_GAMMA], a tree no deeper than its nodes and deep enough for them (`Tree.check_depth`). A table file that
is not UTF-8 JSON of this shape, or an entry that fails a check, is one error naming the file and the entry, at
load, before anything compiles.
"""

from __future__ import annotations

import dataclasses
import json

from jaxspec.checks import check_int
from jaxspec.decoding.settings import Tree
from jaxspec.errors import InputError, SettingsError

MAX_GAMMA = 256  # Speculation.gamma's bound: a table entry drafts no more than a --gamma may
_FIELDS = ("max_active", "gamma", "tree")


@dataclasses.dataclass(frozen=True)
class TableEntry:
  """One row of a `SpeculationTable`: up to `max_active` active slots, draft `gamma` tokens per iteration (0:
  plain decoding), as a chain, or as a token tree of depth gamma when `tree` is given (`Tree.check_depth(gamma)`
  must hold, as for `jaxspec.Speculation`)."""

  max_active: int
  gamma: int = 0
  tree: Tree | None = None

  def __post_init__(self):
    check_int(self.max_active, "TableEntry.max_active", 1)
    check_int(self.gamma, "TableEntry.gamma", 0, MAX_GAMMA, note=" (0: plain decoding)")
    if self.tree is not None and not isinstance(self.tree, Tree):
      raise SettingsError(f"TableEntry.tree must be a jaxspec.Tree or None, got {type(self.tree).__name__}.")
    if self.tree is not None and self.gamma < 1:
      raise SettingsError("TableEntry: a tree needs gamma >= 1 (its depth).")
    if self.tree is not None:
      self.tree.check_depth(self.gamma)  # the check a --tree gets beside --gamma: no deeper than its nodes

  @property
  def plain(self) -> bool:
    return self.gamma == 0


@dataclasses.dataclass(frozen=True)
class SpeculationTable:
  """Active slots -> `TableEntry`; entries sorted by strictly increasing max_active (checked)."""

  entries: tuple[TableEntry, ...]

  def __post_init__(self):
    entries = tuple(self.entries) if isinstance(self.entries, (list, tuple)) else None
    if not entries or not all(isinstance(e, TableEntry) for e in entries):
      raise SettingsError("SpeculationTable needs a non-empty sequence of TableEntry.")
    if any(a.max_active >= b.max_active for a, b in zip(entries, entries[1:])):
      raise SettingsError(f"SpeculationTable entries must have strictly increasing max_active, got "
                          f"{[e.max_active for e in entries]}.")
    object.__setattr__(self, "entries", entries)

  def choose(self, active: int) -> TableEntry:
    """The entry for `active` slots decoding (>= 0)."""
    for entry in self.entries:
      if active <= entry.max_active:
        return entry
    return self.entries[-1]

  def index(self, active: int) -> int:
    return self.entries.index(self.choose(active))

  @property
  def max_gamma(self) -> int:
    return max(e.gamma for e in self.entries)

  def to_json(self) -> str:
    rows = [{"max_active": e.max_active, "gamma": e.gamma,
             "tree": None if e.tree is None else {"top_k": e.tree.top_k, "nodes": e.tree.nodes}}
            for e in self.entries]
    return json.dumps({"entries": rows})

  @classmethod
  def from_json(cls, text: str) -> "SpeculationTable":
    """The table of `to_json`'s text; SettingsError naming the first entry that is malformed or fails a check
    ('entry 2 {...}: ...')."""
    try:
      rows = json.loads(text)["entries"]
      if not isinstance(rows, list) or not rows:
        raise TypeError("'entries' must be a non-empty list")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
      raise SettingsError(f"not a SpeculationTable's JSON ({e}): expected "
                          f'{{"entries": [{{"max_active": 1, "gamma": 4, "tree": null}}, ...]}}.') from None
    return cls(tuple(_entry(i, row) for i, row in enumerate(rows, 1)))

  @classmethod
  def read(cls, path: str, name: str | None = None) -> "SpeculationTable":
    """The table in the file at `path` (`to_json`'s text, UTF-8); one error starting with `name` (default: the
    path): InputError when it cannot be read or is not UTF-8 text, SettingsError for its content."""
    name = name or path
    try:
      with open(path, "rb") as f:
        data = f.read()
    except OSError as e:
      raise InputError(f"{name}: {e.strerror or e}.") from None
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError as e:
      raise InputError(f"{name}: not a text file (byte {e.start} is not UTF-8): expected a SpeculationTable's "
                       "JSON (launch/tune.py --speculation_table writes one).") from None
    try:
      return cls.from_json(text)
    except SettingsError as e:
      raise SettingsError(f"{name}: {e}") from None


def _entry(index: int, row) -> TableEntry:
  """Entry `index` (from 1) of a table's JSON as a checked TableEntry; SettingsError naming it."""
  shown = json.dumps(row)[:120]
  try:
    if not isinstance(row, dict):
      raise SettingsError(f"expected an object {{\"max_active\": ..., \"gamma\": ..., \"tree\": ...}}, got "
                          f"{type(row).__name__}.")
    unknown = sorted(set(row) - set(_FIELDS))
    if unknown or "max_active" not in row or "gamma" not in row:
      raise SettingsError(f"expected the fields max_active, gamma and optionally tree, got {sorted(row)}.")
    tree = row.get("tree")
    if tree is not None:
      if not isinstance(tree, dict) or set(tree) != {"top_k", "nodes"}:
        raise SettingsError(f'tree must be null or {{"top_k": K, "nodes": N}}, got {json.dumps(tree)[:60]}.')
      tree = Tree(top_k=tree["top_k"], nodes=tree["nodes"])
    return TableEntry(max_active=row["max_active"], gamma=row["gamma"], tree=tree)
  except SettingsError as e:
    raise SettingsError(f"entry {index} {shown}: {e}") from None
