"""`jaxspec.Model`: a configuration, its parameters and (optionally) its tokenizer, for any registered family; and
`jaxspec.FeatureHead`: a draft head that reads a target's hidden states (EAGLE-3). They live in the models layer so
that decoding and checkpoint (which take and build them) import nothing above themselves; `jaxspec.model`
re-exports them (docs/layers.md)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from jaxspec.models import registry
from jaxspec.models.contract import Decoder, ModelConfig
from jaxspec.models.hf_table import get_path

if TYPE_CHECKING:
  from jaxspec.models.eagle3 import Eagle3Config


@dataclasses.dataclass
class Model:
  """A loaded model. `params` is a plain pytree of arrays laid out as `model.family.param_axes(model.config)`."""

  config: ModelConfig
  params: dict
  tokenizer: Any = None  # a jaxspec.tokenizer.Tokenizer or None (its module, checkpoint/, is above this layer)
  name: str | None = None

  @classmethod
  def random(cls, config: ModelConfig, seed: int = 0, dtype=None, name: str | None = None,
             tokenizer: Any = None) -> "Model":
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


@dataclasses.dataclass(eq=False)
class FeatureHead:
  """A loaded feature head (EAGLE-3 / SpecForge `LlamaForCausalLMEagle3`, from `jaxspec.load`): it drafts for the
  target it was trained on, reading that target's hidden states. Use it as `jaxspec.Speculation(head, gamma=3)`;
  `jaxspec.save(head, directory)` writes the reference's format back. `params` is `jaxspec.models.eagle3`'s pytree
  (d2t / t2d included; `embedding` only when the file has its own, else the target's table is used)."""

  config: "Eagle3Config"
  params: dict
  name: str | None = None
  # The target it was trained on (`eagle3.target_signature`, config.json's jaxspec_target; None: not recorded, as
  # in SpecForge's heads): drafting for another target warns.
  target: dict | None = None

  @property
  def num_params(self) -> int:
    return sum(x.size for x in jax.tree.leaves(self.params))

  def __repr__(self) -> str:
    c = self.config
    kind = "EAGLE-3 for T5 (cross-attention)" if c.cross_attention else "EAGLE-3"
    return (f"FeatureHead(name={self.name!r}, {kind}, {self.num_params / 1e6:.1f}M params, hidden={c.hidden_size}, "
            f"draft_vocab={c.draft_vocab_size}, vocab={c.vocab_size}, "
            f"own_embedding={'yes' if 'embedding' in self.params else 'no'})")
