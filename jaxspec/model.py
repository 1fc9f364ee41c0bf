"""`jaxspec.Model`: a configuration, its parameters and (optionally) its tokenizer, for any registered family."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.models import registry
from jaxspec.models.contract import Decoder, ModelConfig
from jaxspec.models.hf_table import get_path
from jaxspec.tokenizer import Tokenizer


@dataclasses.dataclass
class Model:
  """A loaded model. `params` is a plain pytree of arrays laid out as `model.family.param_axes(model.config)`."""

  config: ModelConfig
  params: dict
  tokenizer: Tokenizer | None = None
  name: str | None = None

  @classmethod
  def random(cls, config: ModelConfig, seed: int = 0, dtype=None, name: str | None = None,
             tokenizer: Tokenizer | None = None) -> "Model":
    """A model of `config`'s family and shapes with random weights (the family's initialisation, float32 unless
    `dtype`): for benchmarks of real shapes, demos and a draft that is never right (`random:NAME` drafts)."""
    family = registry.family_of(config)
    params = family.init_params(config, jax.random.key(seed), dtype or jnp.float32)
    return cls(config, params, tokenizer, name)

  @property
  def family(self) -> registry.Family:
    return registry.family_of(self.config)

  def decoder(self) -> Decoder:
    """The decoding loop's adapter for this model (hashable: equal configs give equal decoders)."""
    return self.family.decoder(self.config)

  @property
  def dtype(self):
    return get_path(self.params, self.family.embedding_path).dtype

  @property
  def num_params(self) -> int:
    return sum(x.size for x in jax.tree.leaves(self.params))

  def __repr__(self) -> str:
    fields = ", ".join(f"{k}={v}" for k, v in self.config.summary().items()) if hasattr(
        self.config, "summary") else f"vocab={self.config.vocab_size}"
    return (f"Model(name={self.name!r}, {self.family.name}, {self.num_params / 1e6:.1f}M params, {self.dtype}, "
            f"{fields}, tokenizer={'yes' if self.tokenizer else 'no'})")
