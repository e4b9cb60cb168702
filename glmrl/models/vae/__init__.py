"""GLM-Image VAE (diffusers AutoencoderKL) in Flax NNX."""

from glmrl.models.vae.config import VAEConfig
from glmrl.models.vae.model import (AutoencoderKL, LatentDist, denormalize_latents,
                                    normalize_latents)

__all__ = ["AutoencoderKL", "LatentDist", "VAEConfig", "denormalize_latents", "normalize_latents"]
