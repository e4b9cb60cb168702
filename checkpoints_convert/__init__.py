"""GLM-Image checkpoint conversion between HF safetensors folders and Orbax.

    python -m checkpoints_convert --hf_dir=HF --out_dir=OUT
    python -m checkpoints_convert --to_hf --ckpt_dir=OUT --hf_out_dir=HF2

`load_params` / `load_model` read a converted component folder back.
"""

from checkpoints_convert.hf_to_flax import convert, load_model, load_params
from checkpoints_convert.flax_to_hf import export

__all__ = ["convert", "export", "load_model", "load_params"]
