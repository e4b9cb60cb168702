"""The settings `auto` resolves for the run at hand: where the AR sampler reads the generator
(`rollout.ar_weights`) and the DiT's attention kernel (`model.dit_attention`).

Both default to `auto`, the layout and kernel the compile reports show fastest wherever they fit:
- `model.dit_attention`: splash on TPU, cuDNN on NVIDIA GPUs in 16-bit compute, XLA's elsewhere
  (`glmrl.models.dit.attention.for_platform`).
- `rollout.ar_weights`: "gathered" (the generator cast to the compute dtype and whole on every data x fsdp
  chip for the rollout: nothing gathered per token) when that copy, the sampler's KV cache and the run's
  resident state fit in `FIT_FRACTION` of a chip's memory, else "update" (the update's FSDP layout, gathered
  at every token). With mesh.fsdp = 1 the two layouts are one: "update", no copy.
  The released t2i recipe on v5p-64 samples 4.4x faster gathered (its compile report: 34.1 s link-bound -> 7.8 s
  HBM-bound); on v6e-8 its 18.8 GiB copy beside 14.9 GiB of resident state exceeds a chip's 32 GB, and it keeps
  "update".

The sizes are the abstract run's (`glmrl.programs.abstract.build`): per-chip bytes of every resident array as the
run shards it. An explicit value is kept as given.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from glmrl import sharding as sharding_lib
from glmrl.programs import report as report_lib
from glmrl.errors import UserError
from glmrl.models import glm_image
from glmrl.models.dit import attention as attention_lib
from glmrl.sampling import rollout_weights

# The share of a chip's memory the rollout's resident bytes may take. The rest is left to the sampler's
# temporaries, which the estimate does not count: the released t2i sampler's are 10.0 GiB per chip on v5p-64 with
# the gathered copy (its compile report), where 22.9 GiB of resident bytes leave 65 GiB. On a chip where the
# estimate fits and the temporaries do not, --mode=compile reports the sampler over HBM.
FIT_FRACTION = 0.9
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Choice:
  """What `auto` became for one config key, and why (one log line, one compile-report entry)."""
  key: str    # e.g. "rollout.ar_weights"
  value: str
  why: str

  def line(self) -> str:
    return f"config.{self.key}=auto -> {self.value!r}: {self.why}"


def dit_attention(config, platform: str) -> Choice | None:
  """`model.dit_attention`'s choice on `platform`, or None when the config names a kernel."""
  if config.model.dit_attention != "auto":
    return None
  dtype = config.model.compute_dtype
  value = attention_lib.for_platform(platform, glm_image.DTYPES[dtype])
  why = {"splash": "Pallas flash attention on TPU",
         "cudnn": f"cuDNN flash attention on an NVIDIA GPU in {dtype}"}.get(
             value, f"XLA's attention on {platform} in {dtype} (no flash kernel there)")
  return Choice("model.dit_attention", value, why)


def kv_cache_bytes_per_chip(run) -> int:
  """The AR sampler's KV cache per chip: every layer's keys and values of the batch's rows on a chip over the
  prompt and the generated tokens, in the compute dtype (`ArModel.init_cache`)."""
  text = run.configs.ar.text
  rows = -(-run.batch_size // sharding_lib.batch_devices(run.mesh))
  slots = run.prompt_len + run.layout.num_new_tokens - 1
  return int(2 * text.num_hidden_layers * rows * text.num_key_value_heads * slots * text.head_dim
             * np.dtype(run.configs.ar.dtype).itemsize)


def ar_weights(config, mesh, abstract_run, hbm_bytes: int) -> Choice | None:
  """`rollout.ar_weights`' choice on `mesh` of chips of `hbm_bytes` each, or None when the config names a layout.
  `abstract_run()`: the run's `glmrl.programs.abstract.AbstractRun`, built only when the sizes decide."""
  if config.rollout.ar_weights != "auto":
    return None
  if mesh.shape["fsdp"] == 1:
    return Choice("rollout.ar_weights", "update", "mesh.fsdp=1: the update's layout is already unsplit, no copy")
  run = abstract_run()
  _, states = run.component("ar")
  copy = report_lib.bytes_per_chip(rollout_weights.abstract(states, run.configs.ar.dtype))
  cache = kv_cache_bytes_per_chip(run)
  resident = sum(run.resident_bytes().values())
  need, room = resident + copy + cache, FIT_FRACTION * hbm_bytes
  sizes = (f"resident state {resident / GIB:.2f} GiB + the {np.dtype(run.configs.ar.dtype).name} generator copy "
           f"{copy / GIB:.2f} GiB + KV cache {cache / GIB:.2f} GiB = {need / GIB:.2f} GiB per chip")
  limit = f"{FIT_FRACTION:.0%} of {hbm_bytes / GIB:.1f} GiB"
  if need <= room:
    return Choice("rollout.ar_weights", "gathered", f"{sizes}, within {limit} (no per-token gathers)")
  return Choice("rollout.ar_weights", "update", f"{sizes}, over {limit}: the sampler gathers the FSDP-split "
                "weights per token instead")


def choose(plan, mesh, hbm_bytes: int, abstract_run) -> tuple:
  """The Choices the `auto` settings of `plan` (a draft `glmrl.programs.plan.RunPlan`) become on `mesh` of its
  platform's chips of `hbm_bytes` each (its config unchanged: `glmrl.programs.plan.make` writes them);
  `abstract_run(plan)` builds its `AbstractRun` when a choice depends on the run's sizes."""
  config = plan.config
  return tuple(c for c in (dit_attention(config, plan.platform),
                           ar_weights(config, mesh, lambda: abstract_run(plan), hbm_bytes)) if c is not None)


def check_resident_fits(run, hbm_bytes: int) -> None:
  """UserError when the run's resident state alone exceeds a chip's memory (nothing `auto` can choose fits)."""
  resident = sum(run.resident_bytes().values())
  if resident > hbm_bytes:
    raise UserError(f"the run's resident state takes {resident / GIB:.2f} GiB per device, more than a device's "
                    f"{hbm_bytes / GIB:.2f} GiB: shard it over more devices (config.mesh) or train LoRA "
                    "(config.lora.rank)")
