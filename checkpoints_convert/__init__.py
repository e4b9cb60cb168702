"""GLM-Image checkpoint conversion between HF safetensors folders and Orbax.

    python -m checkpoints_convert --hf_dir=HF --out_dir=OUT
    python -m checkpoints_convert --to_hf --ckpt_dir=OUT --hf_out_dir=HF2

Reward models have converters of their own: `python -m checkpoints_convert.clip`,
`python -m checkpoints_convert.aesthetic`, `python -m checkpoints_convert.lpips`. Runtime code reads
converted folders with `glmrl.checkpoint.params`; `load_component` builds one folder's model.
"""

from checkpoints_convert.components import load_component
from checkpoints_convert.flax_to_hf import export
from checkpoints_convert.hf_to_flax import convert_pipeline

__all__ = ["convert_pipeline", "export", "load_component"]
