"""Embedded decoder-RL demo: RL on the DiT of a tiny random GLM-Image, on a laptop CPU, in minutes.

The AR generator is sampled but not trained (one token grid per prompt); the DiT's adapters learn from
`decoder.group_size` samples of each grid. `python main.py --config=configs/demo_decoder.py[:ALGORITHM]
--workdir=DIR`, ALGORITHM one of
- (none) or `flow_grpo`: Flow-GRPO on a 2-step SDE window of 4 CFG-guided steps;
- `cps`: Flow-GRPO's newer recipe: the CPS sampler (noise 0.8) and CFG-free training (one DiT pass per step);
- `guard`: Flow-GRPO with GRPO-Guard's normalised ratio and MixGRPO's sliding window (it moves one step later
  halfway through);
- `nft`, `awm`, `dgpo`: DiffusionNFT, Advantage Weighted Matching and Direct Group Preference Optimization as their
  repositories release them (`configs/released.py`, setting by setting with file and line; the table in
  docs/reference/released_recipes.md): nft its default recipe (CFG-free, 9 of 10 steps per image, the average's
  decay min(0.001 n, 0.5)), awm its OCR recipe (CFG-free, 6 stratified steps of 14 shared by each data shard's
  micro-batch, ghuber, clip 1, KL 1 to the average and 0.003 to the base), dgpo its OCR recipe (rollouts at CFG 4.5 and a CFG-free loss,
  4 of the 7 noisiest of 10 steps shared by the batch, clip_dsm at 1e-2, KL 0.02).
  Where the demo deviates, for all three: `decoder.group_size` 8 (released 16 or 24) for the CPU's budget and
  `decoder.optim.learning_rate` 3e-2 (released 3e-4), the one rate at which every variant's tiny random DiT learns
  in 30 rollouts; each rollout takes the model's Euler ODE steps (DPM-Solver-2, the SA-solver and DPM in the
  repositories), and DGPO's switch to rollouts by its average after rollout 200 is not built.
"""

from configs import demo
from configs import released


ALGORITHMS = ("flow_grpo", "cps", "guard", "nft", "awm", "dgpo")


def get_config(arg=None):
  algorithm = arg or "flow_grpo"
  if algorithm not in ALGORITHMS:
    raise ValueError(f"unknown config argument {arg!r}; this config takes one of {list(ALGORITHMS)} or none")
  c = demo.get_config()
  c.train.policies = "decoder"
  c.train.num_steps = 30
  c.data.prompts_per_step = 2
  c.decoder.group_size = 8
  c.decoder.train_steps = 4
  c.decoder.lora.rank = 8
  c.decoder.lora.alpha = 16.0
  c.decoder.optim.learning_rate = 3e-2  # every algorithm's demo: the same rate
  # The tiny random VAE's brightness hardly moves with its latents; its saturation does (a "detail" reward
  # the decoder can raise on its own, as the report gives the decoder the high-frequency rewards).
  c.decoder.rewards = ({"name": "saturation", "weight": 1.0},)
  c.decoder.algorithm = "flow_grpo" if algorithm in ("cps", "guard") else algorithm
  if c.decoder.algorithm == "flow_grpo":  # its SDE window (nft, awm and dgpo draw the steps they train)
    c.decoder.window_size = 2
    c.decoder.window_start = -1
    # Of 4 steps the first half is the window itself; let it start anywhere but hold the final step.
    c.decoder.window_range = (0, 3)
  if algorithm == "cps":
    c.decoder.sde_type = "cps"
    c.decoder.noise_level = 0.8
    c.decoder.train_guidance = 1.0
  if algorithm == "guard":
    c.decoder.ratio_norm = True
    c.decoder.window_slide_every, c.decoder.window_slide_stride = 15, 1
  if algorithm in released.RECIPES:
    released.apply(c, algorithm)
  c.checkpoint.save_interval = 10
  c.log.image_interval = 10
  return c
