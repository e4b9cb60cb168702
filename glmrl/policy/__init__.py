"""The trained policies: one state per policy (`state.py`: split model, optimizer, reference; built alike for
the run and `--mode=compile`), the one gradient accumulation and optimizer step (`accumulate.py`), the
optimizer (`optimizer.py`), and each policy's rollout batch, loss and update (`ar.py`: GRPO on the AR
generator's tokens; `decoder.py`: Flow-GRPO on the DiT; `decoder_matching.py`: DiffusionNFT and AWM on it, by
`config.decoder.algorithm`), the moving average of trained parameters (`ema.py`), listed by name in `registry.py`."""
