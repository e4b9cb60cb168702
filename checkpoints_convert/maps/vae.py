"""Key map of the VAE (`vae/`, diffusers AutoencoderKL) <-> `glmrl.models.vae.AutoencoderKL`."""

from checkpoints_convert.rules import CONV2D, IDENTITY, TRANSPOSE, Rule


def _conv(hf: str, flax: str):
  return (Rule(hf + ".weight", flax + ".kernel", CONV2D), Rule(hf + ".bias", flax + ".bias"))


def _norm(hf: str, flax: str):
  return (Rule(hf + ".weight", flax + ".scale", IDENTITY), Rule(hf + ".bias", flax + ".bias"))


def _linear(hf: str, flax: str):
  return (Rule(hf + ".weight", flax + ".kernel", TRANSPOSE), Rule(hf + ".bias", flax + ".bias"))


def _resnet(hf: str, flax: str):
  return (_norm(hf + ".norm1", flax + ".norm1") + _conv(hf + ".conv1", flax + ".conv1")
          + _norm(hf + ".norm2", flax + ".norm2") + _conv(hf + ".conv2", flax + ".conv2")
          + _conv(hf + ".conv_shortcut", flax + ".conv_shortcut"))


def _mid(part: str):
  hf, flax = part + ".mid_block", part + ".mid_block"
  attn_hf, attn_flax = hf + ".attentions.0", flax + ".attention"
  return (_resnet(hf + ".resnets.{j}", flax + ".resnets.{j}")
          + _norm(attn_hf + ".group_norm", attn_flax + ".group_norm")
          + sum((_linear(f"{attn_hf}.{n}", f"{attn_flax}.{n}") for n in ("to_q", "to_k", "to_v")), ())
          + _linear(attn_hf + ".to_out.0", attn_flax + ".to_out"))


def _part(part: str, blocks: str, sampler_hf: str, sampler_flax: str):
  return (_conv(part + ".conv_in", part + ".conv_in")
          + _resnet(f"{part}.{blocks}.{{i}}.resnets.{{j}}", f"{part}.{blocks}.{{i}}.resnets.{{j}}")
          + _conv(f"{part}.{blocks}.{{i}}.{sampler_hf}", f"{part}.{blocks}.{{i}}.{sampler_flax}")
          + _mid(part)
          + _norm(part + ".conv_norm_out", part + ".conv_norm_out")
          + _conv(part + ".conv_out", part + ".conv_out"))


RULES = (
    _part("encoder", "down_blocks", "downsamplers.0.conv", "downsample.conv")
    + _part("decoder", "up_blocks", "upsamplers.0.conv", "upsample.conv")
    + _conv("quant_conv", "quant_conv")
    + _conv("post_quant_conv", "post_quant_conv")
)
