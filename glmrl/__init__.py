"""glmrl: GRPO post-training of GLM-Image in JAX/Flax NNX.

Tensor names carry their shapes after the last underscore, one letter per axis joined by `x`
(`q_BxLxHxD`); letters written together name one flattened axis (`flat_YLxD`: Y x L rows), digits
are literal sizes, and `...`-style leading axes take the names of the common case. Each letter has
one meaning throughout the package:

  B  rows of a batch (samples; prompts x group size in a rollout)
  P  prompts (groups of a rollout)            G  samples per prompt (the group size)
  N  generated (new) tokens of a sample       S  a whole sequence (prompt + generated, or a joint
  L  tokens of this call's input (queries)       text + image sequence)
  T  key/value tokens attended to (cache slots, text tokens)
  X  image tokens or patches                  Y  glyph texts (quoted strings) of a batch
  E  model width                              D  per-head or per-token feature width
  H  attention heads                          K  key/value heads        Q  query heads per key/value head
  I  input width of a linear map              O  output width           J  members of a stacked kernel
  U  chunks of a chunked loop                 Z  tokens of one chunk    M  micro-batches
  R  LoRA rank                                W  trained steps of a DiT policy (its SDE window's, or
                                                 the slots drawn per image)
  V  vocabulary or codebook entries           C  channels               F  features (frequencies, patch pixels)
  A  rotary (angle) features                  h, w  spatial height and width (pixels, latents or grids)
  s  denoising steps of a schedule            e  its step edges (s + 1 sigmas)
"""

from glmrl.runtime import library_logs as _library_logs
from glmrl.runtime import platform as _platform

_library_logs.drop_known_noise()

if _platform.chosen_at_import():
  _platform.choose()

import flax  # noqa: E402

# Parameters carry logical axis names (`out_sharding=("embed", "mlp")`) that are
# resolved against a mesh by `glmrl.sharding` when the train state is built.
# Eager sharding would demand a mesh at every module construction (tests,
# conversion, eval_shape), so it is turned off library-wide.
flax.config.update("flax_always_shard_variable", False)
