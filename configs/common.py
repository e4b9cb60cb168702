"""Fields shared by every experiment; each experiment file overrides what differs."""

import ml_collections
from ml_collections import config_dict


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # Seeds parameter init (random models), data shuffling, sampling and decoder noise.

  c.model = ml_collections.ConfigDict()
  c.model.checkpoint_dir = ""  # Converted GLM-Image folder (checkpoints_convert output); "": random `preset`.
  c.model.preset = "tiny"  # Random-model size when checkpoint_dir is empty: "tiny" (tests/demo) or "full".
  c.model.param_dtype = "float32"  # Trained AR parameters: "float32" or "bfloat16".
  c.model.compute_dtype = "float32"  # Activations / matmuls: "float32" or "bfloat16".
  c.model.remat = False  # Rematerialise each AR decoder layer in the backward pass (saves activation memory).

  c.data = ml_collections.ConfigDict()
  c.data.prompts_file = config_dict.placeholder(str)  # .txt (one prompt per line) or .jsonl; required.
  c.data.mode = "t2i"  # "t2i" (text-to-image) or "i2i" (image-to-image: records carry source_images).
  c.data.height = 1024  # Target image height in pixels (multiple of 32).
  c.data.width = 1024  # Target image width in pixels (multiple of 32).
  c.data.max_prompt_tokens = 128  # Fixed (left-padded) prompt length incl. grid tokens: one compilation.
  c.data.max_glyph_tokens = 64  # Glyph (quoted text) tokens are padded and masked to a multiple of this.
  c.data.prompts_per_step = 2  # Distinct prompts per rollout batch; the batch is prompts_per_step * group_size.

  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 0.9  # AR sampling temperature (checkpoint default).
  c.sampling.top_p = 0.75  # AR nucleus sampling mass (checkpoint default); 1.0 disables it.
  c.sampling.top_k = 0  # AR top-k; 0 disables it.
  c.sampling.constrain_to_codebook = True  # Only codebook ids inside grids; the end token closes them.
  c.sampling.dit_steps = 50  # DiT denoising steps (reference default).
  c.sampling.guidance_scale = 1.5  # Classifier-free guidance scale of the DiT (reference default).
  c.sampling.share_noise_in_group = True  # Same decoder noise within a group: rewards differ only by AR tokens.

  c.grpo = ml_collections.ConfigDict()
  c.grpo.group_size = 16  # Samples per prompt (>= 2).
  c.grpo.num_iterations = 1  # Policy updates (mu) per rollout batch.
  c.grpo.epsilon_low = 0.2  # Lower clip range of the importance ratio.
  c.grpo.epsilon_high = 0.28  # Upper clip range (DAPO clip-higher when > epsilon_low).
  c.grpo.beta = 0.0  # KL penalty weight to the initial policy; 0 holds no reference copy.
  c.grpo.kl = "k3"  # KL estimator: "k1", "k2" or "k3".
  c.grpo.aggregation = "seq_mean_token_mean"  # Loss aggregation (see glmrl.grpo.policy_loss).
  c.grpo.scale = "group"  # Advantage scaling: "group", "batch" or "none".
  c.grpo.estimator = "grpo"  # Advantage baseline: "grpo" (group mean) or "rloo" (leave-one-out).
  c.grpo.drop_zero_variance_groups = False  # Exclude groups whose rewards are all equal from the update.
  c.grpo.loss_tokens = "all"  # Tokens in the loss: "all" generated tokens, or only the "target" grid's.

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 1e-5  # Peak AdamW learning rate.
  c.optim.warmup_steps = 10  # Linear warmup steps before the cosine decay.
  c.optim.weight_decay = 0.0  # AdamW decoupled weight decay.
  c.optim.b1 = 0.9  # AdamW beta1.
  c.optim.b2 = 0.999  # AdamW beta2.
  c.optim.max_grad_norm = 1.0  # Global gradient-norm clipping threshold.

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 1000  # Rollout/update steps.
  c.train.micro_batch_size = 0  # Sequences per gradient micro-batch; 0 uses the whole batch at once.
  c.train.max_consecutive_nonfinite = 5  # Stop after this many consecutive NaN/inf losses or rewards.

  # Weighted sum, each logged. A tuple so flags can replace it whole: --config.rewards="({'name': 'saturation',
  # 'weight': 1.0},)"; one entry's field: --config.rewards[0].weight=2.0.
  c.rewards = (ml_collections.ConfigDict({"name": "brightness", "weight": 1.0}),)  # {name, weight[, normalize, kwargs]}
  c.normalize_rewards_per_group = False  # Standardise each reward within its group before summing.

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1  # Data-parallel axis size; -1 means "the remaining devices".
  c.mesh.fsdp = -1  # Fully-sharded axis size; -1 means "the remaining devices".
  c.mesh.tensor = 1  # Tensor-parallel axis size.

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.save_interval = 100  # Save every this many steps (and at the end).
  c.checkpoint.max_to_keep = 3  # Keep the last K checkpoints.

  c.log = ml_collections.ConfigDict()
  c.log.image_interval = 50  # Write sample grids every this many steps.

  c.eval = ml_collections.ConfigDict()
  c.eval.interval = 0  # Evaluate on held-out prompts every this many steps; 0 disables.
  c.eval.prompts_file = ""  # Held-out prompts (.txt or .jsonl); evaluated with fixed seeds.
  c.eval.seed = 1234  # Fixed sampling seed of evaluation.
  return c
