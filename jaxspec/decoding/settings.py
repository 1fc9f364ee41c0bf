"""`Sampling` and `Speculation`: what `jaxspec.generate` decodes with, as two typed settings objects (with the
`Tree` shape a speculation may draft, and `NGramDraft`, prompt lookup's setting).

    out = jaxspec.generate(target, texts, jaxspec.Speculation(draft, gamma=5), jaxspec.Sampling(temperature=0.7))

Each checks itself when it is made and raises one `SettingsError` (a `jaxspec.JaxspecError`, a ValueError) naming
the field, so a bad value never reaches a compiled program. Both are frozen: the tuner returns a `Speculation`,
launch scripts build them from flags, and `dataclasses.replace(s, gamma=3)` gives a checked variant.

What recompiles: `Sampling.temperature == 0` (greedy or not) and whether top-k / top-p are on, and
`Speculation`'s draft (its kind and shapes), gamma and schedule, are static; the temperature itself, top_k, top_p
and every other `Speculation` field are runtime values (a new value never recompiles).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Union

from jaxspec.checks import check_int, is_int, is_real
from jaxspec.errors import SettingsError

if TYPE_CHECKING:
  from jaxspec.models.loaded import FeatureHead, Model

SCHEDULES = ("constant", "heuristic", "adaptive")
MAX_TOP_K = 64  # k^2 candidates per depth; EAGLE-2 uses 8 to 10
MAX_NODES = 1024  # the target verifies nodes + 1 tokens in one call; EAGLE-2 uses 60


def _check_int(name: str, value, low: int, high: int) -> None:
  check_int(value, f"Tree.{name}", low, high)


@dataclasses.dataclass(frozen=True)
class Tree:
  """The shape of the token tree a drafter proposes each iteration (EAGLE-2's dynamic tree).

  top_k: children proposed per expanded node, and nodes expanded per depth (1: a chain).
  nodes: drafted nodes kept after the rerank (the target verifies nodes + 1 tokens: the root too).
  The depth is the speculation's gamma. Checked when made: one SettingsError naming the field.
  """

  top_k: int = 8
  nodes: int = 60

  def __post_init__(self):
    _check_int("top_k", self.top_k, 1, MAX_TOP_K)
    _check_int("nodes", self.nodes, 1, MAX_NODES)
    object.__setattr__(self, "top_k", int(self.top_k))
    object.__setattr__(self, "nodes", int(self.nodes))

  def pool_size(self, depth: int) -> int:
    """Candidates proposed over `depth` expansions (the root excluded): k + (depth - 1) k^2."""
    return self.top_k + (depth - 1) * self.top_k ** 2

  def fits(self, depth: int) -> bool:
    """Whether `depth` (gamma) suits this shape: 1 <= depth <= nodes (a tree of N nodes is at most N deep) and
    depth expansions propose at least `nodes` candidates (top_k=1: exactly depth == nodes, the chain of gamma)."""
    return 1 <= depth <= self.nodes and self.pool_size(depth) >= self.nodes

  def check_depth(self, depth: int) -> None:
    """SettingsError unless `fits(depth)`: `depth` (gamma) >= 1 expansions propose at least `nodes` candidates,
    and depth <= nodes."""
    if depth > self.nodes >= 1:
      raise SettingsError(f"Tree(top_k={self.top_k}, nodes={self.nodes}) with gamma {depth} is deeper than its "
                          f"{self.nodes} nodes: a tree of {self.nodes} nodes is at most {self.nodes} deep. Use gamma "
                          f"<= {self.nodes} or more nodes.")
    if depth < 1 or self.pool_size(depth) < self.nodes:
      raise SettingsError(f"Tree(top_k={self.top_k}, nodes={self.nodes}) needs a depth (gamma) proposing at least "
                          f"{self.nodes} candidates; depth {depth} proposes {self.pool_size(max(depth, 1))}.")


MODES = ("greedy", "sampled", "filtered")  # Sampling.mode's values, least general first


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise SettingsError(message)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How the next token is chosen from the target's distribution (and the draft's, warped the same way).

  temperature: 0 for greedy (argmax on both sides; the output is the target's greedy decode), > 0 samples.
  top_k: keep the k most likely tokens (0 = off). top_p: nucleus mass in (0, 1] (1 = off); the most likely token
  is always kept, so a top_p smaller than any token's probability (1e-300 included, which float32 holds as 0)
  samples that token alone.
  """

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    t, k, p = self.temperature, self.top_k, self.top_p
    _require(is_real(t) and math.isfinite(t) and t >= 0,
             f"Sampling.temperature must be a finite number >= 0 (0 = greedy), got {t!r}.")
    check_int(k, "Sampling.top_k", 0, note=" (0 = off)")
    _require(k < 2**31, f"Sampling.top_k must be below 2**31, got {k!r}.")
    _require(is_real(p) and 0 < p <= 1, f"Sampling.top_p must be in (0, 1] (1 = off), got {p!r}.")

  @property
  def mode(self) -> str:
    """What a compiled program specialises on, one of MODES (least general first): "greedy" (temperature 0: argmax
    on both sides), "filtered" (sampling with top-k or top-p on: the loop sorts the vocabulary) or "sampled". The
    one greedy / sampled / filtered predicate: `generate`'s static settings (planner.plan), the slot engine's step
    programs and the server's requests (RequestSettings.sampling) read it."""
    if self.temperature == 0:
      return "greedy"
    return "filtered" if (self.top_k > 0 or self.top_p < 1) else "sampled"

  @property
  def greedy(self) -> bool:
    return self.mode == "greedy"

  @property
  def filtering(self) -> bool:
    """Top-k or top-p is active when sampling (the loop then sorts the vocabulary)."""
    return self.mode == "filtered"


@dataclasses.dataclass(frozen=True)
class NGramDraft:
  """A draft without a model (prompt lookup, jaxspec.decoding.drafters.ngram):
  `jaxspec.Speculation(jaxspec.NGramDraft(), gamma=...)`. Each iteration a row proposes the tokens that followed the earliest earlier occurrence of its
  context's last n tokens, n from max_ngram down to min_ngram. Static settings: each pair compiles its own loop.
  """

  max_ngram: int = 3
  min_ngram: int = 1

  def __post_init__(self):
    check_int(self.min_ngram, "NGramDraft.min_ngram", 1)
    _require(is_int(self.max_ngram) and self.max_ngram >= self.min_ngram,
             f"NGramDraft.max_ngram must be an integer >= min_ngram={self.min_ngram}, got {self.max_ngram!r}.")

  @property
  def name(self) -> str:
    return f"ngram({self.min_ngram}-{self.max_ngram})"


@dataclasses.dataclass(frozen=True, eq=False)
class Speculation:
  """What drafts for the target, and how many tokens per iteration.

  draft: a smaller `jaxspec.Model` with the target's tokenizer, `jaxspec.NGramDraft(...)` (prompt lookup, no
    model), or a `jaxspec.FeatureHead` (an EAGLE-3 head from `jaxspec.load`, trained on the target: it drafts
    from the target's hidden states).
  gamma: the most draft tokens per row and iteration (>= 1).
  schedule: how many of them each iteration drafts (jaxspec.decoding.device.schedules): "constant" (gamma every
    iteration), "heuristic" (transformers': +2 after a fully accepted block, -1 otherwise, in [1, gamma]) or
    "adaptive" (the length that maximises Theorem 3.8's tokens per cost from the running acceptance estimates).
    At batch > 1 the length is the batch's. Output is exact under every schedule; when sampling, a row's sample
    under "heuristic" / "adaptive" depends on its batch neighbours' histories (its distribution does not).
  draft_confidence: in [0, 1), 0 = off; a row stops drafting after a token whose draft distribution's top
    probability is below it (schedules other than "constant").
  fallback_alpha: in [0, 1], 0 = off; when the active rows' mean running acceptance estimate is below it, the
    batch decodes plainly and drafts again after `probe_interval` such iterations (not with "constant").
  probe_interval: resting iterations between probes (>= 1); doubles after each failed probe.
  draft_cost: c, a draft step's cost relative to a verify call, read by "adaptive"; None: the drafter's default
    (0 for prompt lookup, schedules.DEFAULT_DRAFT_COST for a model, head_drafter.HEAD_DRAFT_COST for a head).
  prior_alpha: in [0, 1]: each row's acceptance estimate before any evidence (1: every row starts by drafting);
    `jaxspec.tune` passes the draft's measured acceptance.
  tree: None (chains: gamma tokens per row), or a `jaxspec.Tree(top_k, nodes)`: each iteration the draft
    proposes a token tree of depth gamma and the target verifies every node in one call (docs/trees.md): a draft
    model or a feature head grows EAGLE-2's dynamic tree (a head: EAGLE-3's trees), prompt lookup makes its
    top_k earliest matches branches. Needs schedule "constant" and gamma <= nodes; top_k=1 needs gamma == nodes
    (the chain of gamma tokens).

  Equality is identity (a Speculation holds a model's weights); `describe()` names it for logs and reports.
  """

  draft: Union["Model", "NGramDraft", "FeatureHead"]
  gamma: int = 4
  schedule: str = "constant"
  draft_confidence: float = 0.0
  fallback_alpha: float = 0.0
  probe_interval: int = 4
  draft_cost: float | None = None
  prior_alpha: float = 1.0
  tree: Tree | None = None

  def __post_init__(self):
    # The kind is the registry's to check (when the draft source is made: settings.py imports no drafter); what
    # can never be a draft is refused now.
    _require(self.draft is not None and not isinstance(self.draft, (str, bytes, int, float)),
             f"Speculation.draft must be a jaxspec.Model, a jaxspec.FeatureHead or a jaxspec.NGramDraft (a model or "
             f"head from jaxspec.load), got {type(self.draft).__name__}" + (f" {self.draft!r}: load it first."
                                                                             if isinstance(self.draft, str) else "."))
    g, c, f, i, d, a = (self.gamma, self.draft_confidence, self.fallback_alpha, self.probe_interval, self.draft_cost,
                        self.prior_alpha)
    check_int(g, "Speculation.gamma", 1, 256, note=" (draft tokens per iteration)")
    _require(self.schedule in SCHEDULES, f"Speculation.schedule must be one of {SCHEDULES}, got {self.schedule!r}.")
    _require(is_real(c) and 0 <= c < 1, f"Speculation.draft_confidence must be in [0, 1) (0 = off), got {c!r}.")
    _require(is_real(f) and 0 <= f <= 1, f"Speculation.fallback_alpha must be in [0, 1] (0 = off), got {f!r}.")
    check_int(i, "Speculation.probe_interval", 1)
    _require(i < 2**31, f"Speculation.probe_interval must be below 2**31, got {i!r}.")
    _require(d is None or (is_real(d) and math.isfinite(d) and d >= 0),
             f"Speculation.draft_cost must be a finite number >= 0 (or None), got {d!r}.")
    _require(is_real(a) and 0 <= a <= 1, f"Speculation.prior_alpha must be in [0, 1] (1 = optimistic), got {a!r}.")
    _require(self.schedule != "constant" or (c == 0 and f == 0),
             "Speculation.draft_confidence and fallback_alpha need schedule='heuristic' or 'adaptive': "
             "schedule='constant' drafts gamma tokens every iteration.")
    if self.tree is not None:
      _require(isinstance(self.tree, Tree), f"Speculation.tree must be a jaxspec.Tree(top_k, nodes) or None, got "
               f"{type(self.tree).__name__}.")
      _require(self.schedule == "constant", f"Speculation.tree drafts a whole tree every iteration: it needs "
               f"schedule='constant', got {self.schedule!r}.")
      self.tree.check_depth(g)

  def replace(self, **changes) -> "Speculation":
    """A checked copy with some fields changed."""
    return dataclasses.replace(self, **changes)

  def describe(self) -> str:
    """'NAME gamma=G' plus the schedule and every knob away from its default, for logs and reports."""
    name = getattr(self.draft, "name", None) or type(self.draft).__name__
    parts = [f"{name} gamma={self.gamma}"]
    for field in dataclasses.fields(self):
      if field.name not in ("draft", "gamma") and getattr(self, field.name) != field.default:
        parts.append(f"{field.name}={getattr(self, field.name)}")
    return " ".join(parts)
