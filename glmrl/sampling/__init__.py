"""Sampling: the autoregressive token sampler and its log-probs, the DiT denoising loop (ODE, or Flow-GRPO's
SDE window with its recorded steps), the flow-matching schedule and the whole pipeline, for any parameters
a caller passes (a trained policy's, or the released ones)."""
