"""A LoRA training run's adapters -> PEFT's or diffusers' adapter format, or merged into the base's kernels.

Our adapters sit beside the kernels they adapt (`glmrl.models.lora`): lora_a [in, R] and lora_b [R, out]
(a stacked kernel [in, J, out] has one adapter of the fused map, lora_b [R, J, out]). PEFT stores, per
adapted HF module, `base_model.model.<module>.lora_A.weight` [R, in] and `...lora_B.weight` [out, R]
with the update scaled by lora_alpha / r, the same scale as ours. The module is the HF linear whose
weight the kernel's key map names (`text.layers.0.attn.q.kernel` -> `...self_attn.q_proj`); a fused
HF linear ([J*out, in], e.g. gate_up_proj) takes lora_b's members in its row order, as the kernel does.

The generator (a transformers model) is written as a PEFT adapter folder (`PeftModel.from_pretrained`);
the DiT decoder (a diffusers model, whose pipeline has no `load_lora_weights`) as diffusers' LoRA file,
the same tensors keyed `transformer.<module>.lora_A.weight`, its LoraConfig in the file's metadata
(`pipe.transformer.load_lora_adapter(folder, weight_name="pytorch_lora_weights.safetensors")`: diffusers 0.42
looks for a .bin unless given the file name).
"""

from __future__ import annotations

import json
import os

import numpy as np

from checkpoints_convert import safetensors_stream as st
from checkpoints_convert.rules import KeyMap
from glmrl.errors import UserError

ADAPTERS_DIR = "adapters"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
# diffusers' LoRA file (`LORA_WEIGHT_NAME_SAFE`) and the safetensors metadata key of its LoraConfig
# (`LORA_ADAPTER_METADATA_KEY`), diffusers.loaders.lora_base.
DIFFUSERS_ADAPTER_WEIGHTS = "pytorch_lora_weights.safetensors"
DIFFUSERS_METADATA_KEY = "lora_adapter_metadata"
_A, _B = "lora_a", "lora_b"


def adapter_pairs(adapters: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{kernel path: (lora_a, lora_b)} of a flat {flax path: array} of adapters; ValueError on an unpaired one."""
  layers = sorted({p.rsplit(".", 1)[0] for p in adapters})
  unpaired = [l for l in layers if f"{l}.{_A}" not in adapters or f"{l}.{_B}" not in adapters]
  stray = [p for p in adapters if p.rsplit(".", 1)[-1] not in (_A, _B)]
  if unpaired or stray:
    raise UserError(f"not a LoRA adapter state: unpaired {unpaired[:4]}, not adapters {stray[:4]}")
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
    raise UserError(f"adapter update {delta(a, b, 1.0).shape} does not fit the kernel {kernel.shape}")
  return (kernel.astype(np.float32) + delta(a, b, scale)).astype(kernel.dtype)


def check_fit(pairs: dict[str, tuple[np.ndarray, np.ndarray]], kernel_shapes: dict[str, tuple[int, ...]],
              base: str) -> None:
  """Each adapter (`adapter_pairs`) must adapt a kernel of the base (`kernel_shapes`: {flax path: shape})
  of its update's shape; ValueError naming `base` otherwise."""
  bad = []
  for path, (a, b) in pairs.items():
    update = (a.shape[0], *b.shape[1:])
    want = kernel_shapes.get(path)
    if a.ndim != 2 or a.shape[1] != b.shape[0] or want is None or tuple(want) != update:
      bad.append(f"{path}: adapter update {list(update)} (rank {a.shape[-1]}/{b.shape[0]}), "
                 f"base {list(want) if want is not None else 'has no such kernel'}")
  if bad:
    raise UserError(f"the adapters do not fit the base {base}: {'; '.join(bad[:4])}"
                    + (f" (and {len(bad) - 4} more)" if len(bad) > 4 else ""))


def lora_tensors(adapters: dict[str, np.ndarray], key_map: KeyMap,
                 prefix: str) -> tuple[dict[str, np.ndarray], list[str]]:
  """({`prefix`<module>.lora_A.weight [R, in] / .lora_B.weight [out, R]: array}, [HF module names]) of our
  adapters: the layout PEFT and diffusers share (torch Linear orientation), under their key prefixes."""
  tensors, modules = {}, []
  for kernel_path, (a, b) in adapter_pairs(adapters).items():
    match = key_map.flax_to_hf(kernel_path)
    if match is None or not match[0].endswith(".weight"):
      raise ValueError(f"{kernel_path}: no HF linear weight in the key map for this adapted kernel")
    module = match[0][:-len(".weight")]
    rank = a.shape[-1]
    tensors[f"{prefix}{module}.lora_A.weight"] = np.ascontiguousarray(a.T)
    tensors[f"{prefix}{module}.lora_B.weight"] = np.ascontiguousarray(b.reshape(rank, -1).T)
    modules.append(module)
  return tensors, modules


def peft_tensors(adapters: dict[str, np.ndarray], key_map: KeyMap) -> tuple[dict[str, np.ndarray], list[str]]:
  """({PEFT key: array}, [HF module names]) of our adapters."""
  return lora_tensors(adapters, key_map, PEFT_PREFIX)


def lora_config(record: dict, modules: list[str]) -> dict:
  """The `peft.LoraConfig` fields of a run's adapters (both formats record these): the update is scaled by
  lora_alpha / r, exactly ours (no rsLoRA); target modules by their full names, so exactly the trained
  layers are adapted."""
  return {"r": int(record["rank"]), "lora_alpha": float(record["alpha"]), "lora_dropout": 0.0, "bias": "none",
          "target_modules": sorted(modules), "fan_in_fan_out": False, "init_lora_weights": True,
          "use_rslora": False, "use_dora": False}


def _check_rank(tensors: dict[str, np.ndarray], record: dict, record_name: str):
  ranks = {t.shape[0] for k, t in tensors.items() if k.endswith("lora_A.weight")}
  if ranks != {record["rank"]}:
    raise UserError(f"adapters of rank {sorted(ranks)}, {record_name} says {record['rank']}")


def _write_tensors(out_dir: str, weights_name: str, tensors: dict[str, np.ndarray], metadata=None):
  names = sorted(tensors, key=st.natural_key)
  specs = [st.TensorSpec(k, tensors[k].shape, tensors[k].dtype) for k in names]
  total = sum(t.nbytes for t in tensors.values())
  st.write_safetensors(out_dir, weights_name, specs, tensors.__getitem__, max_shard_size=total + 1,
                       metadata=metadata)
  return total


def write_peft_adapter(out_dir: str, adapters: dict[str, np.ndarray], record: dict, key_map: KeyMap,
                       base_model: str | None, record_name: str = "lora.json") -> dict:
  """`out_dir`/{adapter_config.json, adapter_model.safetensors} as `peft.PeftModel.from_pretrained` reads them.

  `record`: the run's lora.json ({"rank", "alpha", ...}).
  """
  tensors, modules = peft_tensors(adapters, key_map)
  _check_rank(tensors, record, record_name)
  os.makedirs(out_dir, exist_ok=True)
  config = {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model,
            **lora_config(record, modules), "modules_to_save": None, "inference_mode": True}
  with open(os.path.join(out_dir, ADAPTER_CONFIG), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  total = _write_tensors(out_dir, ADAPTER_WEIGHTS, tensors)
  return {"modules": len(modules), "tensors": len(tensors), "bytes": total}


def write_diffusers_adapter(out_dir: str, adapters: dict[str, np.ndarray], record: dict, key_map: KeyMap,
                            prefix: str, record_name: str = "decoder_lora.json") -> dict:
  """`out_dir`/pytorch_lora_weights.safetensors as diffusers' `save_lora_weights` writes a model's adapter.

  Keys are `<prefix>.<module>.lora_A.weight` / `.lora_B.weight`; the safetensors metadata
  "lora_adapter_metadata" holds the LoraConfig (`lora_config`) under the same prefix, from which
  `ModelMixin.load_lora_adapter(out_dir, weight_name=..., prefix=<prefix>)` (a PeftAdapterMixin) builds the adapter:
  its scale is exactly alpha / rank (without that metadata diffusers would take alpha = rank).
  """
  tensors, modules = lora_tensors(adapters, key_map, f"{prefix}.")
  _check_rank(tensors, record, record_name)
  os.makedirs(out_dir, exist_ok=True)
  config = {f"{prefix}.{k}": v for k, v in lora_config(record, modules).items()}
  metadata = {DIFFUSERS_METADATA_KEY: json.dumps(config, indent=2, sort_keys=True)}
  total = _write_tensors(out_dir, DIFFUSERS_ADAPTER_WEIGHTS, tensors, metadata)
  return {"modules": len(modules), "tensors": len(tensors), "bytes": total}
