"""Load-adaptive speculation: which draft length (or tree, or none) the slot engine runs for how many active slots.

    table = SpeculationTable((TableEntry(max_active=1, gamma=5), TableEntry(max_active=8, gamma=2),
                              TableEntry(max_active=64, gamma=0)))   # gamma 0: plain decoding
    table.choose(3)    # TableEntry(max_active=8, gamma=2)
    SpeculationTable.from_json(table.to_json()) == table

Entry i covers active-slot counts in (entries[i-1].max_active, entries[i].max_active]; the last entry also covers
every count above its max_active. The engine compiles one step program per distinct entry (and sampling mode),
all over one state layout: the caches are allocated for the largest gamma / tree of the table. The tuner measures
such a table (`jaxspec.bench.tune.speculation_table`).
"""

from __future__ import annotations

import dataclasses
import json

from jaxspec.checks import check_int
from jaxspec.decoding.settings import Tree
from jaxspec.errors import SettingsError


@dataclasses.dataclass(frozen=True)
class TableEntry:
  """One row of a `SpeculationTable`: up to `max_active` active slots, draft `gamma` tokens per iteration (0:
  plain decoding), as a chain, or as a token tree of depth gamma when `tree` is given."""

  max_active: int
  gamma: int = 0
  tree: Tree | None = None

  def __post_init__(self):
    check_int(self.max_active, "TableEntry.max_active", 1)
    check_int(self.gamma, "TableEntry.gamma", 0, note=" (0: plain decoding)")
    if self.tree is not None and not isinstance(self.tree, Tree):
      raise SettingsError(f"TableEntry.tree must be a jaxspec.Tree or None, got {type(self.tree).__name__}.")
    if self.tree is not None and self.gamma < 1:
      raise SettingsError("TableEntry: a tree needs gamma >= 1 (its depth).")

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
    try:
      rows = json.loads(text)["entries"]
      entries = tuple(TableEntry(max_active=r["max_active"], gamma=r["gamma"],
                                 tree=None if r.get("tree") is None else Tree(**r["tree"])) for r in rows)
    except (ValueError, KeyError, TypeError) as e:
      raise SettingsError(f"not a SpeculationTable's JSON ({e}): expected "
                          f'{{"entries": [{{"max_active": 1, "gamma": 4, "tree": null}}, ...]}}.') from None
    return cls(entries)
