"""Fields shared by every experiment; each experiment file overrides what differs."""

import ml_collections
from ml_collections import config_dict


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # Seeds parameter init (random models), data shuffling, sampling and decoder noise.

  c.model = ml_collections.ConfigDict()
  c.model.checkpoint_dir = ""  # Converted GLM-Image folder (checkpoints_convert output); "": random `preset`.
  c.model.preset = "tiny"  # Random-model size when checkpoint_dir is empty: "tiny" (tests/demo) or "full".
  # bfloat16: the forward reads bf16 weights, the optimizer keeps a float32 master copy (2 bytes per parameter
  # more than float32, docs/training.md "Memory per trained parameter").
  c.model.param_dtype = "float32"  # Trained AR parameters: "float32" or "bfloat16".
  c.model.compute_dtype = "float32"  # Activations / matmuls: "float32" or "bfloat16".
  # DiT attention kernel: "xla" (all queries' scores at once), "blocked" (512 queries at a time: never the
  # [B, heads, S, S] scores of 1024^2 images), "cudnn" (flash attention, NVIDIA GPUs, bf16), "splash" (Pallas
  # flash attention, TPUs) or "auto" (splash on TPU, cudnn on GPU in bf16, else xla, for the platform the run runs on
  # or --mode=compile compiles for; the run logs its choice, the compile report records it).
  c.model.dit_attention = "auto"  # DiT attention kernel (see above).
  # Classifier-free guidance's two DiT passes as one forward of twice the batch (larger matmuls; the pass's
  # activations double; off in the released configs). Text-to-image only.
  c.model.dit_cfg_batched = False  # Both CFG branches in one DiT forward.
  # Rematerialise each AR decoder layer in the backward pass (saves activation memory); with a decoder policy
  # trained, each DiT block too (glmrl/programs/plan.py).
  c.model.remat = False  # Rematerialise in the backward pass (see above).

  # Low-rank adapters on the AR generator: only the adapters (and their optimizer state) train, the base stays
  # frozen (KL reference = adapters off). Update scale alpha / rank (PEFT's convention; flax's nnx.LoRA has none).
  c.lora = ml_collections.ConfigDict()
  c.lora.rank = 0  # Adapter rank; 0 = full fine-tuning of the decoder.
  c.lora.alpha = 0.0  # Update scale numerator (scale = alpha / rank); 0 = unset: alpha = rank (scale 1).
  c.lora.targets = "ar"  # Adapted linear layers: preset "ar" (decoder q/k/v/o, gate_up, down) or a regex over paths.

  c.data = ml_collections.ConfigDict()
  c.data.prompts_file = config_dict.placeholder(str)  # .txt (one prompt per line) or .jsonl; required.
  c.data.mode = "t2i"  # "t2i" (text-to-image) or "i2i" (image-to-image: records carry source_images).
  c.data.height = 1024  # Target image height in pixels (multiple of 32).
  c.data.width = 1024  # Target image width in pixels (multiple of 32).
  c.data.max_prompt_tokens = 128  # Fixed (left-padded) prompt length incl. grid tokens: one compilation.
  c.data.max_glyph_tokens = 64  # Fixed glyph (ByT5) tokens per prompt, all its quoted texts; longer is an error.
  c.data.max_glyph_texts = 4  # Fixed number of quoted texts per prompt the glyph encoder holds; more is an error.
  c.data.prompts_per_step = 2  # Distinct prompts per rollout batch; the batch is prompts_per_step * group_size.

  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 0.9  # AR sampling temperature (checkpoint default).
  c.sampling.top_p = 0.75  # AR nucleus sampling mass (checkpoint default); 1.0 disables it.
  c.sampling.top_k = 0  # AR top-k; 0 disables it.
  c.sampling.constrain_to_codebook = True  # Only codebook ids inside grids; the end token closes them.
  c.sampling.dit_steps = 50  # DiT denoising steps (reference default).
  c.sampling.guidance_scale = 1.5  # Classifier-free guidance scale of the DiT (reference default).
  # Samples per DiT denoise+decode call: bounds the decoder's activations (full attention over every image
  # token at 1024^2). 0 picks one sample per data x fsdp device (the least memory that keeps every chip busy);
  # -1 decodes each batch in one call. A number must divide the batch, split over data x fsdp, and divide or be a
  # multiple of group_size.
  c.sampling.decode_batch = 0  # Samples per decoder call (see above); 0: picked, -1: whole batch.
  c.sampling.share_noise_in_group = True  # Same decoder noise within a group: rewards differ only by AR tokens.

  c.grpo = ml_collections.ConfigDict()
  c.grpo.group_size = 16  # Samples per prompt (>= 2).
  c.grpo.num_iterations = 1  # Policy updates (mu) per rollout batch; each is one optimizer (schedule) update.
  c.grpo.epsilon_low = 0.2  # Lower clip range of the importance ratio.
  c.grpo.epsilon_high = 0.28  # Upper clip range (DAPO clip-higher when > epsilon_low).
  c.grpo.beta = 0.0  # KL penalty weight to the initial policy; 0 holds no reference copy.
  c.grpo.kl = "k3"  # KL estimator: "k1", "k2" or "k3".
  c.grpo.aggregation = "seq_mean_token_mean"  # Loss aggregation (see glmrl.grpo.policy_loss).
  c.grpo.scale = "group"  # Advantage scaling: "group", "batch" or "none".
  c.grpo.estimator = "grpo"  # Advantage baseline: "grpo" (group mean) or "rloo" (leave-one-out).
  c.grpo.drop_zero_variance_groups = False  # Drop (near-)constant groups (see std_eps) from every loss term, KL too.
  # A group whose unbiased reward std is <= std_eps * its largest |reward| counts as constant: zero advantages,
  # rather than its rounding noise standardised into order-one ones. Also applies to normalize_rewards_per_group.
  c.grpo.std_eps = 1e-5  # Near-constant group threshold, relative: float in [0, 1); 0 = only exact ties.
  # Truncated importance sampling of the sampler/learner mismatch (verl, TRL): each token's surrogate is
  # weighted by min(exp(learner old logp - sampler logp), tis_cap); the KL term is not.
  c.grpo.tis_cap = 0.0  # 0 = off; else >= 1 (2 is usual).
  # How tis_cap bounds the weight: "token_truncate" (above); "sequence_mask" (TRL's default): each sequence's
  # exp(sum over its tokens of the log-ratio), the sequence left out of the surrogate (weight 0) above tis_cap.
  c.grpo.tis_mode = "token_truncate"  # "token_truncate" or "sequence_mask".
  # verl's dual clip (clip_ratio_c, its default 3; TRL's delta where c >= 1 + epsilon_high, docs/training.md): a
  # negative advantage's token adds at most -c A to the loss however large its ratio, and no gradient past it.
  c.grpo.dual_clip = 0.0  # 0 = off; else c > 1.
  # The importance ratio per "token", or per "sequence": the exp of the mean of its tokens' log-ratios, shared by
  # its tokens (GSPO, arXiv:2507.18071; TRL's importance_sampling_level; its paper clips at 3e-4 / 4e-4).
  c.grpo.ratio_level = "token"  # "token" or "sequence".
  # The KL estimate times the importance ratio (TRL's use_bias_correction_kl, its default): unbiased for KL(pi ||
  # pi_ref) once the policy has moved from the one that sampled (num_iterations > 1). Needs grpo.beta > 0.
  c.grpo.kl_bias_correction = False  # KL estimate times the ratio (needs beta > 0).
  c.grpo.loss_tokens = "all"  # Tokens in the loss: "all" generated tokens, or only the "target" grid's.

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 1e-5  # Peak AdamW learning rate.
  # The schedule counts updates (num_steps * num_iterations); the cosine decays to zero one update past the last.
  c.optim.warmup_steps = 10  # Linear warmup in rollout steps (= warmup_steps * num_iterations updates).
  c.optim.weight_decay = 0.0  # AdamW decoupled weight decay.
  c.optim.b1 = 0.9  # AdamW beta1.
  c.optim.b2 = 0.999  # AdamW beta2.
  # Added to sqrt(v): gradients far below it take steps shrunk by |g| / eps (OCR-reward RL has been reported to give
  # gradients under 1e-8 and to train with 1e-15).
  c.optim.eps = 1e-8  # AdamW epsilon (optax's default).
  c.optim.max_grad_norm = 1.0  # Global gradient-norm clipping threshold.

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 1000  # Rollout/update steps.
  c.train.micro_batch_size = 0  # Sequences per gradient micro-batch; 0 uses the whole batch at once.
  c.train.max_consecutive_nonfinite = 5  # Stop after this many consecutive NaN/inf losses or rewards.
  # Which policies train: the AR generator (GRPO on its tokens), the DiT decoder (Flow-GRPO on its SDE steps) or
  # both from one rollout (GLM-Image's decoupled RL). A rollout is prompts x grpo.group_size token grids x
  # decoder.group_size decoder samples (docs/decoder_rl.md); "ar" alone: one decoder sample per grid.
  c.train.policies = "ar"  # "ar", "decoder" or "ar+decoder".

  # The decoder policy, used when train.policies includes "decoder": Flow-GRPO (arXiv:2505.05470: PPO on the SDE
  # window's Gaussian steps), DiffusionNFT (arXiv:2509.16117: implicit positive/negative policies on the forward
  # process, clean images of an ODE rollout, sampled by the moving average), AWM (arXiv:2509.25050: the
  # flow-matching loss as log-likelihood in a PPO ratio) or DGPO (Direct Group Preference Optimization: each
  # image's flow-matching error weighted by its advantage and its group's DPO weight). docs/decoder_rl.md.
  c.decoder = ml_collections.ConfigDict()
  c.decoder.algorithm = "flow_grpo"  # "flow_grpo", "nft", "awm" or "dgpo".
  # The released recipe this config applies (configs/released.py's rows, `released.apply`): a setting changed away
  # from its row is one warning naming the row and the repository's value; another decoder.algorithm is refused.
  c.decoder.recipe = ""  # "nft", "awm" or "dgpo" (configs/demo_decoder.py's variants); "": none.
  # CFG scale of training rollouts and of the loss's velocities; 1.0 = CFG-free (one DiT pass per step, the RL
  # distils the guidance); 0 = sampling.guidance_scale. Evaluation and generate keep sampling.guidance_scale.
  c.decoder.train_guidance = 0.0  # Training CFG scale (see above).
  # nft/awm/dgpo: CFG scale of the loss's velocities (the policy's, the reference's, the moving average's) when it
  # differs from the rollout's: DGPO samples at 4.5 and trains without guidance (1.0). 0 = train_guidance.
  c.decoder.loss_guidance = 0.0  # 0 = train_guidance; flow_grpo's loss is its rollout's own steps.
  c.decoder.train_timesteps = 0  # nft/awm/dgpo: schedule steps trained per image per update (distinct, random); 0 = all.
  # nft/awm/dgpo: which steps of decoder.train_steps' schedule they train (glmrl/policy/dit_matching.py SlotDraw):
  # "uniform" (any), "high_noise" (the first high_noise_steps: DGPO's, its trunc_steps + 1) or "stratified" (one
  # per stratum of steps 1 .. int(train_steps x stratified_fraction): AWM's discrete_wo_init).
  c.decoder.timestep_draw = "uniform"  # "uniform", "high_noise" or "stratified".
  c.decoder.high_noise_steps = 0  # high_noise: the first this many steps (DGPO's trunc_steps + 1), >= train_timesteps.
  c.decoder.stratified_fraction = 0.9  # stratified: in (0, 1], the schedule's share the strata span (AWM's 0.9).
  # Who shares a draw of trained steps: each image its own, a group's images, the rows of one update micro-batch
  # on one data shard (AWM's, per micro-batch of each GPU) or the whole batch (DGPO's). dgpo draws per group at
  # least (its groups share their noise).
  c.decoder.timestep_sharing = "image"  # "image", "group", "micro_batch" (of each data shard) or "batch".
  c.decoder.nft_beta = 1.0  # nft: b in (0, 1], the step from the old policy to the implicit positive/negative ones.
  # awm: the log-likelihood's weight of its flow-matching error: "uniform", "t" (sigma), "t2" (sigma^2), or AWM's
  # released "ghuber": -sigma ((mse + 1e-10)^p - 1e-10^p) / p, p = awm_ghuber_power (`glmrl.grpo.matching`).
  c.decoder.awm_weighting = "uniform"  # "uniform", "t", "t2" or "ghuber".
  c.decoder.awm_ghuber_power = 0.25  # ghuber's p in (0, 1] (AWM's 0.25; 1 is "t").
  # awm: advantages clipped to adv_clip_max then scaled by advantage_max / adv_clip_max (AWM's released 1: into
  # [-1, 1], its surrogate 1/5 of the unscaled one); 0 = off.
  c.decoder.advantage_max = 0.0  # 0 = off; else > 0 (AWM's 1).
  # dgpo: beta of its group DPO weight sigmoid(beta sum_i A_i (error_i - reference error_i) / G) (DGPO's beta_dpo,
  # 100 in its released OCR and GenEval recipes, 10 for PickScore).
  c.decoder.dgpo_beta = 100.0  # dgpo: beta_dpo > 0.
  # dgpo: DGPO's clip_dsm (on in its released configs): an image's flow error takes no gradient where its ratio
  # exp(error under the moving average - error) is past 1 + clip_range (positive advantage) or under 1 - clip_range
  # (negative); the average is DGPO's ema_ref (its decay min(0.3, 0.001 n): decoder.ema decay 0.3, ramp 0.001).
  c.decoder.dgpo_clip_dsm = False  # dgpo: clip against the moving average (needs decoder.ema.every >= 1).
  c.decoder.ema_beta = 0.0  # Weight of the velocity KL to the moving average (AWM's anchor); needs ema.every >= 1.
  # Moving average of the decoder's trained parameters (glmrl/policy/ema.py): nft's old policy (it samples the
  # rollouts), AWM's anchor, DGPO's ema_ref; saved in checkpoints. Its decay is min(decay, ramp * (n - flat)) once
  # the optimizer has taken n steps (its own count: num_iterations per rollout; 0 while n < flat; ramp 0: decay).
  c.decoder.ema = ml_collections.ConfigDict()
  c.decoder.ema.decay = 0.0  # Decay in [0, 1): 0 copies the parameters.
  c.decoder.ema.every = 0  # Update it after every this many rollouts (or updates, see `after`); 0 keeps none.
  # When it folds the parameters in: "rollout" (after the rollout's updates: DiffusionNFT, AWM) or "update" (after
  # every optimizer step: DGPO's ema_ref).
  c.decoder.ema.after = "rollout"  # "rollout" or "update".
  c.decoder.ema.ramp = 0.0  # Per-step growth of the decay up to `decay` (DiffusionNFT's 0.001); 0: constant.
  # Optimizer steps the average is a copy of the parameters (decay 0) before the ramp starts from 0: DiffusionNFT's
  # decay_type 2 (its OCR recipe) is flat 75, ramp 0.0075, decay 0.999; type 1 is flat 0, ramp 0.001, decay 0.5.
  c.decoder.ema.flat = 0  # Optimizer steps of decay 0 before the ramp (DiffusionNFT decay_type 2: 75).
  c.decoder.group_size = 4  # Decoder samples per token grid (its advantages compare them), >= 2.
  # flow_grpo's stochastic step: "sde" (Euler-Maruyama of the flow's SDE) or "cps" (coefficient-preserving: the
  # step's noise keeps the marginal's data:noise mix exactly; noise_level 0.8 in Flow-GRPO's recipe).
  c.decoder.sde_type = "sde"  # "sde" or "cps".
  c.decoder.noise_level = 0.7  # The SDE's a: std_t = a sqrt(sigma / (1 - sigma)) (Flow-GRPO's default 0.7).
  # A step's log-prob: "density", the Gaussian's per-element log-density (the PPO ratio is the step's likelihood
  # ratio, every step on one scale); "flow_grpo", Flow-GRPO's CPS log-prob -mean((x' - mu)^2) (sde_type "cps"
  # only): the density's log-ratio times 2 step_std^2, as the reference trains (`glmrl.grpo.flow.step_logprob`).
  c.decoder.logprob = "density"  # "density" or "flow_grpo" (with sde_type "cps").
  c.decoder.train_steps = 10  # Denoising steps of training rollouts; evaluation and generate keep sampling.dit_steps.
  c.decoder.window_size = 2  # Consecutive SDE (trained) steps per rollout; the ODE elsewhere.
  # First SDE step; -1 draws it per rollout uniformly so that the window lies within window_range. A fixed start may
  # put the window anywhere (window_start=0 with window_size=train_steps: every step).
  c.decoder.window_start = -1  # First SDE step, or -1 (random, see window_range).
  # Steps [lo, hi) a random window lies within; hi 0: the first half (train_steps // 2, at least lo + window_size).
  # hi <= train_steps - 1: a random window never holds the final step (its noise would stay in the decoded image).
  c.decoder.window_range = (0, 0)  # (lo, hi) of a random window (Flow-GRPO's sde_window_range).
  # MixGRPO's sliding window (arXiv:2507.21802) instead of a random one: the start walks window_range from lo by
  # window_slide_stride steps (0: window_size, non-overlapping) every window_slide_every rollout steps, then stays
  # at the last start, or with window_slide_roll_back starts over.
  c.decoder.window_slide_every = 0  # Rollout steps per window position; 0: a random window per rollout.
  c.decoder.window_slide_stride = 0  # Steps the window moves each time; 0: window_size.
  c.decoder.window_slide_roll_back = False  # Past the last start: back to the first (True) or stay (False).
  c.decoder.clip_range = 1e-4  # PPO clip of the per-step ratio of mean log-probs (Flow-GRPO's 1e-4; AWM's 1), <= 1.
  # GRPO-Guard (arXiv:2510.22319): the ratio's log scaled by the step's noise std with its mean-shift bias added
  # back (`glmrl.grpo.flow.guard_log_ratio`), so the clip acts alike on every step; retune clip_range with it.
  c.decoder.ratio_norm = False  # GRPO-Guard's normalised ratio (flow_grpo).
  c.decoder.adv_std = "group"  # Advantages divided by the group's reward std ("group") or the batch's ("batch").
  c.decoder.adv_clip_max = 5.0  # Advantages are clipped to [-adv_clip_max, adv_clip_max].
  c.decoder.beta = 0.0  # KL weight on the step means vs the initial DiT (adapters off with DiT LoRA).
  c.decoder.num_iterations = 1  # Decoder updates per rollout.
  c.decoder.micro_batch_size = 0  # Samples per decoder gradient micro-batch; 0: the whole batch.
  c.decoder.lora = ml_collections.ConfigDict()
  c.decoder.lora.rank = 32  # DiT adapter rank; 0 = full DiT fine-tuning.
  c.decoder.lora.alpha = 64.0  # DiT adapter scale numerator (scale = alpha / rank).
  c.decoder.lora.targets = "dit"  # Adapted DiT layers: preset "dit" (blocks' q/k/v/out, fc1/fc2) or a regex.
  c.decoder.optim = ml_collections.ConfigDict()
  c.decoder.optim.learning_rate = 3e-4  # Peak AdamW learning rate of the DiT (Flow-GRPO's LoRA default).
  c.decoder.optim.warmup_steps = 0  # Linear warmup in rollout steps.
  c.decoder.optim.weight_decay = 1e-4  # AdamW decoupled weight decay.
  c.decoder.optim.b1 = 0.9  # AdamW beta1.
  c.decoder.optim.b2 = 0.999  # AdamW beta2.
  c.decoder.optim.eps = 1e-8  # AdamW epsilon (see optim.eps).
  c.decoder.optim.max_grad_norm = 1.0  # Global gradient-norm clipping threshold.
  # The decoder's rewards (same entries as config.rewards, which are the AR policy's).
  c.decoder.rewards = (ml_collections.ConfigDict({"name": "brightness", "weight": 1.0}),)  # {name, weight, ...}

  # Weighted sum, each logged. A tuple so flags can replace it whole: --config.rewards="({'name': 'saturation',
  # 'weight': 1.0},)"; one entry's field: --config.rewards[0].weight=2.0.
  c.rewards = (ml_collections.ConfigDict({"name": "brightness", "weight": 1.0}),)  # {name, weight[, normalize, kwargs]}
  c.normalize_rewards_per_group = False  # Standardise each reward within its group (as the advantages) before summing.

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1  # Data-parallel axis size; -1 means "the remaining devices".
  c.mesh.fsdp = -1  # Fully-sharded axis size; -1 means "the remaining devices".
  c.mesh.tensor = 1  # Tensor-parallel axis size.

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.save_interval = 100  # Save every this many steps (and at the end).
  c.checkpoint.max_to_keep = 3  # Keep the last K checkpoints.

  c.log = ml_collections.ConfigDict()
  c.log.image_interval = 50  # Write sample grids every this many steps.
  # Weights & Biases too (pip install -r requirements-wandb.txt): every scalar and sample grid TensorBoard gets, in
  # the W&B run <workdir>/wandb/ keeps (a resume continues it; glmrl/logging/wandb_run.py).
  c.log.wandb = False  # Also log to W&B.
  c.log.wandb_project = ""  # W&B project; "": $WANDB_PROJECT, else "glmrl".
  c.log.wandb_name = ""  # W&B run name; "": $WANDB_NAME, else the workdir's name.
  # W&B mode: "online" (needs `wandb login` or WANDB_API_KEY), "offline" (`wandb sync` uploads it later) or "disabled".
  c.log.wandb_mode = ""  # "": $WANDB_MODE, else "online".

  # Where the AR sampler reads the generator's weights: "update" (the update's FSDP layout: every generated token
  # gathers them over fsdp), "gathered" (resharded once per rollout without the fsdp split: tensor-parallel over
  # mesh.tensor and whole on every other chip; the generator's size / tensor more HBM during the rollout) or "auto"
  # ("gathered" where the copy, the KV cache and the resident state fit in 90% of a chip's memory, else "update";
  # glmrl/programs/auto.py; the run logs its choice and why, the compile report records it).
  c.rollout = ml_collections.ConfigDict()
  c.rollout.ar_weights = "auto"  # "auto", "update" or "gathered".
  # Host-side and served rewards score each decoder call's images while the next call runs (docs/rewards.md);
  # False: after the whole decode. The batch, its rewards and advantages are the same either way.
  c.rollout.overlap_rewards = True  # Score host rewards a decoder call at a time.
  c.compile = ml_collections.ConfigDict()
  c.compile.topology = ""  # --mode=compile's target: a TPU slice ("v5p-64", "v5e-256", "v6e-8") or GPUs ("h100-8").
  c.compile.programs = ""  # Only these of the step's programs, e.g. "rewards,update"; "" compiles all of them.

  c.eval = ml_collections.ConfigDict()
  c.eval.interval = 0  # Evaluate on held-out prompts every this many steps; 0 disables.
  c.eval.prompts_file = ""  # Held-out prompts (.txt or .jsonl); evaluated with fixed seeds.
  # A shipped benchmark instead (glmrl/data/benchmarks/README.md: parti, geneval, ocr, pickscore); "NAME:N" takes N
  # of its prompts, drawn with eval.seed (the same N for every checkpoint).
  c.eval.benchmark = ""  # Benchmark name[:N], or "" (eval.prompts_file).
  c.eval.max_prompts = 0  # At most this many held-out prompts, drawn with eval.seed; 0: all.
  # --mode=eval compares these checkpoints ("0,500,1000"; 0: the models before RL) on the same prompts and seeds,
  # writing <workdir>/eval/report.json and report.md with 95% bootstrap intervals; "": the newest checkpoint.
  c.eval.steps = ""  # Checkpoints to compare, or "".
  c.eval.seed = 1234  # Fixed sampling seed of evaluation.
  # --mode=eval with eval.steps: every image's distance to the first listed checkpoint's image of the same prompt
  # and seed (1 - SSIM, pixel RMSE; glmrl/evaluation/drift.py), reported beside the rewards; with converted LPIPS
  # weights here (python -m checkpoints_convert.lpips), LPIPS too.
  c.eval.drift_lpips_dir = ""  # Converted LPIPS folder, or "" (SSIM and RMSE only).
  # One warning when, for this many periodic evaluations in a row, a policy's training reward rose while its held-out
  # reward fell (glmrl/evaluation/monitors.py); 0 disables it.
  c.eval.hacking_patience = 3  # Evaluations of diverging rewards before the warning; 0: never.
  return c
