"""Flax NNX ports of GLM-Image's components."""
