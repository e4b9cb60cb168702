"""A LoRA training run's adapters -> PEFT's adapter format, or merged into the base generator's kernels.

Our adapters sit beside the kernels they adapt (`glmrl.models.lora`): lora_a [in, R] and lora_b [R, out]
(a stacked kernel [in, J, out] has one adapter of the fused map, lora_b [R, J, out]). PEFT stores, per
adapted HF module, `base_model.model.<module>.lora_A.weight` [R, in] and `...lora_B.weight` [out, R]
with the update scaled by lora_alpha / r, the same scale as ours. The module is the HF linear whose
weight the kernel's key map names (`text.layers.0.attn.q.kernel` -> `...self_attn.q_proj`); a fused
HF linear ([J*out, in], e.g. gate_up_proj) takes lora_b's members in its row order, as the kernel does.
"""

from __future__ import annotations

import json
import os

import numpy as np

from checkpoints_convert import safetensors_stream as st
from checkpoints_convert.rules import KeyMap

ADAPTERS_DIR = "adapters"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_A, _B = "lora_a", "lora_b"


def adapter_pairs(adapters: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{kernel path: (lora_a, lora_b)} of a flat {flax path: array} of adapters; ValueError on an unpaired one."""
  layers = sorted({p.rsplit(".", 1)[0] for p in adapters})
  unpaired = [l for l in layers if f"{l}.{_A}" not in adapters or f"{l}.{_B}" not in adapters]
  stray = [p for p in adapters if p.rsplit(".", 1)[-1] not in (_A, _B)]
  if unpaired or stray:
    raise ValueError(f"not a LoRA adapter state: unpaired {unpaired[:4]}, not adapters {stray[:4]}")
  return {f"{l}.kernel": (adapters[f"{l}.{_A}"], adapters[f"{l}.{_B}"]) for l in layers}


def delta(a_IxR: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
  """scale * A @ B in float32: [in, out], or [in, J, out] for a stacked kernel's b [R, J, out]."""
  a = a_IxR.astype(np.float32)
  if b.ndim == 3:
    return np.float32(scale) * np.einsum("ir,rjo->ijo", a, b.astype(np.float32))
  return np.float32(scale) * (a @ b.astype(np.float32))


def merge_kernel(kernel: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
  """The base kernel with its adapter's update added (in float32, cast back to the kernel's dtype)."""
  if kernel.shape != delta(a, b, 1.0).shape:
    raise ValueError(f"adapter update {delta(a, b, 1.0).shape} does not fit the kernel {kernel.shape}")
  return (kernel.astype(np.float32) + delta(a, b, scale)).astype(kernel.dtype)


def peft_tensors(adapters: dict[str, np.ndarray], key_map: KeyMap) -> tuple[dict[str, np.ndarray], list[str]]:
  """({PEFT key: array}, [HF module names]) of our adapters."""
  tensors, modules = {}, []
  for kernel_path, (a, b) in adapter_pairs(adapters).items():
    match = key_map.flax_to_hf(kernel_path)
    if match is None or not match[0].endswith(".weight"):
      raise ValueError(f"{kernel_path}: no HF linear weight in the key map for this adapted kernel")
    module = match[0][:-len(".weight")]
    rank = a.shape[-1]
    tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(a.T)
    tensors[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(b.reshape(rank, -1).T)
    modules.append(module)
  return tensors, modules


def write_peft_adapter(out_dir: str, adapters: dict[str, np.ndarray], record: dict, key_map: KeyMap,
                       base_model: str | None) -> dict:
  """`out_dir`/{adapter_config.json, adapter_model.safetensors} as `peft.PeftModel.from_pretrained` reads them.

  `record`: the run's lora.json ({"rank", "alpha", ...}). Target modules are listed by their full
  names, so exactly the trained layers are adapted.
  """
  tensors, modules = peft_tensors(adapters, key_map)
  ranks = {t.shape[0] for k, t in tensors.items() if k.endswith("lora_A.weight")}
  if ranks != {record["rank"]}:
    raise ValueError(f"adapters of rank {sorted(ranks)}, lora.json says {record['rank']}")
  os.makedirs(out_dir, exist_ok=True)
  config = {
      "peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model,
      "r": int(record["rank"]), "lora_alpha": float(record["alpha"]), "lora_dropout": 0.0, "bias": "none",
      "target_modules": sorted(modules), "fan_in_fan_out": False, "init_lora_weights": True,
      "use_rslora": False, "use_dora": False, "modules_to_save": None, "inference_mode": True,
  }
  with open(os.path.join(out_dir, ADAPTER_CONFIG), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  names = sorted(tensors, key=st.natural_key)
  specs = [st.TensorSpec(k, tensors[k].shape, tensors[k].dtype) for k in names]
  total = sum(t.nbytes for t in tensors.values())
  st.write_safetensors(out_dir, ADAPTER_WEIGHTS, specs, tensors.__getitem__, max_shard_size=total + 1)
  return {"modules": len(modules), "tensors": len(tensors), "bytes": total}
