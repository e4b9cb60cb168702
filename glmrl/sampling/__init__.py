"""Sampling: the autoregressive token sampler, its log-probs, and the flow-matching scheduler."""
