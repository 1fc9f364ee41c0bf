"""Hugging Face weight-name tables: one row per tensor (our pytree path, the HF name, a layout hook).

HF stores `nn.Linear` weights as [out, in]; jaxspec stores [in, out], with attention heads split out. Each
family's table says which `Layout` applies to each tensor and the hooks convert both ways, so loading, saving and
a coverage test (every tensor transformers writes is in the table) all read the same data (maxtext's checkpoint
conversion works the same way).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one tensor is laid out in HF versus jaxspec: `to_ours(array, config)` and `to_hf(array, config)`."""

  name: str
  to_ours: Callable[[np.ndarray, Any], np.ndarray]
  to_hf: Callable[[np.ndarray, Any], np.ndarray]


AS_IS = Layout("as_is", lambda a, c: a, lambda a, c: a)
LINEAR = Layout("linear", lambda a, c: a.T, lambda a, c: a.T)  # [out, in] <-> [in, out]


def heads_in(num_heads: Callable[[Any], int], head_dim: Callable[[Any], int]) -> Layout:
  """q/k/v projections: HF [N*H, D] <-> ours [D, N, H] (N and H read from the config by the callables)."""
  return Layout(
      "heads_in",
      lambda a, c: a.reshape(num_heads(c), head_dim(c), a.shape[-1]).transpose(2, 0, 1),
      lambda a, c: a.transpose(1, 2, 0).reshape(num_heads(c) * head_dim(c), a.shape[0]))


def heads_out(num_heads: Callable[[Any], int], head_dim: Callable[[Any], int]) -> Layout:
  """Output projection: HF [D, N*H] <-> ours [N, H, D]."""
  return Layout(
      "heads_out",
      lambda a, c: a.T.reshape(num_heads(c), head_dim(c), a.shape[0]),
      lambda a, c: a.reshape(num_heads(c) * head_dim(c), a.shape[-1]).T)


def heads_bias(num_heads: Callable[[Any], int], head_dim: Callable[[Any], int]) -> Layout:
  """q/k/v biases: HF [N*H] <-> ours [N, H]."""
  return Layout("heads_bias", lambda a, c: a.reshape(num_heads(c), head_dim(c)),
                lambda a, c: a.reshape(num_heads(c) * head_dim(c)))


@dataclasses.dataclass(frozen=True)
class Row:
  path: tuple  # Keys into our params pytree (str for dicts, int for layer lists).
  hf_name: str
  layout: Layout


def get_path(tree, path: tuple):
  for key in path:
    tree = tree[key]
  return tree


def set_path(tree: dict, path: tuple, value) -> None:
  """Sets tree[path] = value, creating dicts and layer lists (indexed by int) as needed."""
  for key, nxt in zip(path[:-1], path[1:]):
    if isinstance(key, int):
      while len(tree) <= key:
        tree.append({})
      tree = tree[key]
    else:
      tree = tree.setdefault(key, [] if isinstance(nxt, int) else {})
  tree[path[-1]] = value
