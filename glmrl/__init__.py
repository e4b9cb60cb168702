"""glmrl: GRPO post-training of GLM-Image in JAX/Flax NNX."""

import flax

# Parameters carry logical axis names (`out_sharding=("embed", "mlp")`) that are
# resolved against a mesh by `glmrl.sharding` when the train state is built.
# Eager sharding would demand a mesh at every module construction (tests,
# conversion, eval_shape), so it is turned off library-wide.
flax.config.update("flax_always_shard_variable", False)
