"""A tree deeper than it has nodes, or a one-child tree whose depth is not its node count, is one SettingsError
when the Speculation is made (issue 33, M2 and "Low"): never a raw error inside jit, for every drafter."""

import pytest

import jaxspec
from jaxspec.errors import SettingsError


def test_a_tree_deeper_than_its_nodes_is_refused_when_made():
  draft = jaxspec.NGramDraft()
  for gamma, tree, needle in ((4, jaxspec.Tree(2, 3), "gamma 4 is deeper than its 3 nodes"),
                              (2, jaxspec.Tree(8, 1), "gamma 2 is deeper than its 1 nodes"),
                              (5, jaxspec.Tree(1, 3), "gamma 5 is deeper than its 3 nodes"),
                              (2, jaxspec.Tree(1, 3), "depth 2 proposes 2")):
    with pytest.raises(SettingsError, match=needle):
      jaxspec.Speculation(draft, gamma=gamma, tree=tree)
  # The edges that stay valid: as deep as its nodes, and a one-child tree of gamma nodes (the chain of gamma).
  assert jaxspec.Speculation(draft, gamma=3, tree=jaxspec.Tree(2, 3)).tree.nodes == 3
  assert jaxspec.Speculation(draft, gamma=3, tree=jaxspec.Tree(1, 3)).gamma == 3
