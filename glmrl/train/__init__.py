"""GRPO training of the GLM-Image AR generator: optimizer, train step, loop."""
