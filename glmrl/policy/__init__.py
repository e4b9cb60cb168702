"""The trained policies, each bound once to the run's config (`registry.py`, the `base.Policy` interface): one
state per policy (`state.py`: split model, optimizer, reference; built alike for the run and `--mode=compile`),
the one gradient accumulation and optimizer step (`accumulate.py`), the optimizer (`optimizer.py`), the moving
average of trained parameters (`ema.py`), and each policy's trip: `ar.py` (GRPO on the AR generator's tokens);
on the DiT, by `config.decoder.algorithm`, `flow_grpo.py` (Flow-GRPO), `nft.py` (DiffusionNFT) and `awm.py`
(AWM), over what they share (`dit.py`; `dit_matching.py` for the forward-process two)."""
