"""`jaxspec.Model`: a configuration, its parameters and (optionally) its tokenizer."""

from __future__ import annotations

import dataclasses

import jax

from jaxspec.models.t5 import T5Config
from jaxspec.tokenizer import Tokenizer


@dataclasses.dataclass
class Model:
  """A loaded model. `params` is a plain pytree of arrays laid out as `jaxspec.models.t5.param_axes(config)`."""

  config: T5Config
  params: dict
  tokenizer: Tokenizer | None = None
  name: str | None = None

  @property
  def dtype(self):
    return self.params["shared"]["embedding"].dtype

  @property
  def num_params(self) -> int:
    return sum(x.size for x in jax.tree.leaves(self.params))

  def __repr__(self) -> str:
    c = self.config
    return (f"Model(name={self.name!r}, {self.num_params / 1e6:.1f}M params, {self.dtype}, d_model={c.d_model}, "
            f"layers={c.num_layers}/{c.num_decoder_layers}, heads={c.num_heads}, vocab={c.vocab_size}, "
            f"tokenizer={'yes' if self.tokenizer else 'no'})")
