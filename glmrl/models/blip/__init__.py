"""ImageReward (Xu et al. 2023): BLIP's ViT and its text encoder cross-attending to the image, with a preference head."""
