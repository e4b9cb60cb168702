"""The GLM-Image autoregressive generator: config, GLM-4 decoder, vision encoder, VQ, model."""
