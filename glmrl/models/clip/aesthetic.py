"""The LAION "improved aesthetic predictor" head (christophschuhmann/improved-aesthetic-predictor).

An MLP 768 -> 1024 -> 128 -> 64 -> 16 -> 1 on the unit-norm CLIP ViT-L/14 image embedding. The
published model's ReLUs are commented out, so the layers compose linearly (its Dropouts are
identities at inference). Its weights file `sac+logos+ava1-l14-linearMSE.pth` is a torch state_dict
`layers.{0,2,4,6,7}.{weight,bias}`; convert it once with

    python -m checkpoints_convert.aesthetic --pth sac+logos+ava1-l14-linearMSE.pth --out_dir aesthetic

and read the folder with `load_head`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from glmrl.models.stored_module import load_module
from glmrl.models.config_fields import HFConfig
from glmrl.sharding import EMBED, MLP

MODEL_TYPE = "laion_aesthetic_mlp"


@dataclasses.dataclass(frozen=True)
class AestheticConfig(HFConfig):
  """Widths of the MLP: `embed_dim` in, `hidden` layers, then 1 out."""
  HF_FIXED = {"model_type": MODEL_TYPE}
  RUNTIME = ("dtype", "param_dtype")
  embed_dim: int = 768
  hidden: tuple[int, ...] = (1024, 128, 64, 16)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    object.__setattr__(self, "hidden", tuple(self.hidden))
    for w in (self.embed_dim, *self.hidden):
      if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        raise ValueError(f"AestheticConfig widths must be positive ints, got embed_dim={self.embed_dim}, "
                         f"hidden={self.hidden}")
    if len(self.hidden) != 4:
      raise ValueError(f"AestheticConfig.hidden={self.hidden}: the published MLP has 4 hidden layers")

  @classmethod
  def from_hf(cls, d: dict) -> "AestheticConfig":
    """From the config.json the converter writes."""
    if d.get("model_type") != MODEL_TYPE:
      raise ValueError(f"model_type={d.get('model_type')!r}, expected {MODEL_TYPE!r}")
    unknown = sorted(set(d) - {"model_type", "embed_dim", "hidden"})
    if unknown:
      raise ValueError(f"aesthetic config: unknown key(s) {unknown}")
    return cls(embed_dim=d.get("embed_dim", 768), hidden=tuple(d.get("hidden", (1024, 128, 64, 16))))

  @property
  def widths(self) -> tuple[int, ...]:
    return (self.embed_dim, *self.hidden, 1)

  @classmethod
  def full(cls, **overrides) -> "AestheticConfig":
    return cls(**overrides)

  @classmethod
  def tiny(cls, **overrides) -> "AestheticConfig":
    return cls(**{"embed_dim": 16, "hidden": (24, 12, 8, 4), **overrides})


class AestheticHead(nnx.Module):
  """Unit-norm image embeddings [B, embed_dim] -> aesthetic scores [B] (float32)."""

  def __init__(self, cfg: AestheticConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    w = cfg.widths
    names = [(EMBED, MLP)] + [(MLP, MLP)] * (len(w) - 3) + [(MLP, None)]
    self.layers = nnx.List([
        nnx.Linear(w[i], w[i + 1], dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs,
                   kernel_metadata={"out_sharding": names[i]}, bias_metadata={"out_sharding": (names[i][1],)})
        for i in range(len(w) - 1)])

  def __call__(self, embeds_BxE: jax.Array) -> jax.Array:
    if embeds_BxE.ndim != 2 or embeds_BxE.shape[1] != self.cfg.embed_dim:
      raise ValueError(f"embeddings must be [B, {self.cfg.embed_dim}], got shape {tuple(embeds_BxE.shape)}")
    x = embeds_BxE
    for layer in self.layers:
      x = layer(x)
    return x[:, 0].astype(jnp.float32)


def load_head(head_dir: str, sharding=None, **config_overrides) -> AestheticHead:
  """The head stored by `python -m checkpoints_convert.aesthetic` in `head_dir` (`load_module`)."""
  return load_module(
      head_dir, AestheticConfig, AestheticHead, sharding, **config_overrides,
      how_to_make="convert the published weights with `python -m checkpoints_convert.aesthetic`")
