"""Embedded decoder-RL demo: RL on the DiT of a tiny random GLM-Image, on a laptop CPU, in minutes.

The AR generator is sampled but not trained (one token grid per prompt); the DiT's adapters learn from
`decoder.group_size` samples of each grid. `python main.py --config=configs/demo_decoder.py[:ALGORITHM]
--workdir=DIR`, ALGORITHM one of
- (none) or `flow_grpo`: Flow-GRPO on a 2-step SDE window of 4 CFG-guided steps;
- `cps`: Flow-GRPO's newer recipe: the CPS sampler (noise 0.8) and CFG-free training (one DiT pass per step);
- `guard`: Flow-GRPO with GRPO-Guard's normalised ratio and MixGRPO's sliding window (it moves one step later
  halfway through);
- `nft`: DiffusionNFT, CFG-free ODE rollouts sampled by the moving average;
- `awm`: Advantage Weighted Matching as released (its config/dgx_awm.py): the ghuber weighting, advantages rescaled
  to [-1, 1], clip range 1, a KL of weight 1 to a moving average of the adapters and of 0.003 to the base; CFG-free
  ODE rollouts;
- `dgpo`: Direct Group Preference Optimization, CFG-free ODE rollouts, a group's images trained at the same steps
  with the same noise.
"""

from configs import demo


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
  c.decoder.window_size = 2
  c.decoder.window_start = -1
  # Of 4 steps the first half is the window itself; let it start anywhere but hold the final step.
  c.decoder.window_range = (0, 3)
  c.decoder.lora.rank = 8
  c.decoder.lora.alpha = 16.0
  c.decoder.optim.learning_rate = 3e-2  # every algorithm's demo: the same rate
  # The tiny random VAE's brightness hardly moves with its latents; its saturation does (a "detail" reward
  # the decoder can raise on its own, as the report gives the decoder the high-frequency rewards).
  c.decoder.rewards = ({"name": "saturation", "weight": 1.0},)
  c.decoder.algorithm = "flow_grpo" if algorithm in ("cps", "guard") else algorithm
  if algorithm == "cps":
    c.decoder.sde_type = "cps"
    c.decoder.noise_level = 0.8
    c.decoder.train_guidance = 1.0
  if algorithm == "guard":
    c.decoder.ratio_norm = True
    c.decoder.window_slide_every, c.decoder.window_slide_stride = 15, 1
  if algorithm in ("nft", "awm", "dgpo"):
    c.decoder.train_guidance = 1.0  # CFG-free: one DiT pass per step, in the rollout and the update
    c.decoder.train_timesteps = 2  # of the 4 steps, per image per update
  if algorithm in ("nft", "awm"):
    c.decoder.ema.every = 1
  if algorithm == "nft":
    # DiffusionNFT's default schedule of its old policy (its decay_type 1): decay min(0.001 n, 0.5) after step n.
    c.decoder.ema.decay, c.decoder.ema.ramp = 0.5, 0.001
  if algorithm == "awm":
    # AWM's released recipe (config/dgx_awm.py): ghuber weighting, advantages in [-1, 1], clip range 1; anchored by
    # a KL of weight 1 to an average of the adapters (decay min(0.001 n, 0.3)) and of 0.003 to the base.
    c.decoder.awm_weighting, c.decoder.advantage_max, c.decoder.clip_range = "ghuber", 1.0, 1.0
    c.decoder.ema.decay, c.decoder.ema.ramp, c.decoder.ema_beta, c.decoder.beta = 0.3, 0.001, 1.0, 0.003
  c.checkpoint.save_interval = 10
  c.log.image_interval = 10
  return c
