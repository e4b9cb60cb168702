"""Peak memory of the streaming converter on a synthetic multi-GB checkpoint.

Writes a random bf16 `vision_language_encoder/` folder with the released
generator's widths (full embedding table, so the largest tensor is the real
one) but few layers, converts it to Orbax and exports it back to safetensors,
each in a fresh subprocess, and reports every step's peak RSS against the
largest tensor and the total size. Finally checks the round trip bit-exactly.

    python bench/convert_memory.py --text_layers=3 --vision_depth=2 --workdir=/tmp/convert_bench
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
COMPONENT = "vision_language_encoder"


def _status(field: str) -> int:
  """VmRSS / VmHWM of this process in bytes."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f"{field} not in /proc/self/status")


def write_synthetic(hf_dir: str, text_layers: int, vision_depth: int, shard: str) -> dict:
  """Random bf16 weights for every HF key the AR key map renders (no torch needed)."""
  import ml_dtypes
  import numpy as np
  from checkpoints_convert import components, hf_to_flax, safetensors_stream as st
  from glmrl.models.ar.config import ARConfig

  full = ARConfig.full()
  cfg = dataclasses.replace(full, text=dataclasses.replace(full.text, num_hidden_layers=text_layers),
                            vision=dataclasses.replace(full.vision, depth=vision_depth))
  component = components.get(COMPONENT)
  key_map = component.key_map()
  specs = []
  for path, leaf in hf_to_flax.expected_params(component, cfg).items():
    hf_key, transform = key_map.flax_to_hf(path)
    specs.append(st.TensorSpec(hf_key, transform.hf_shape(leaf.shape), np.dtype(ml_dtypes.bfloat16)))
  specs.sort(key=lambda s: st.natural_key(s.key))
  rng = np.random.default_rng(0)

  def read(key):
    spec = next(s for s in specs if s.key == key)
    out = np.empty(int(np.prod(spec.shape)), ml_dtypes.bfloat16)
    # Random normals: realistic (poorly compressible) bytes for Orbax's zstd stage.
    for i in range(0, out.size, 2**24):
      out[i:i + 2**24] = rng.standard_normal(min(2**24, out.size - i), dtype=np.float32)
    return out.reshape(spec.shape)

  out = os.path.join(hf_dir, COMPONENT)
  os.makedirs(out)
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg.to_hf(), f, indent=2)
  st.write_safetensors(out, component.weights_name, specs, read, max_shard_size=st.parse_size(shard))
  sizes = [int(np.prod(s.shape)) * 2 for s in specs]
  return {"tensors": len(specs), "total_bytes": sum(sizes), "largest_bytes": max(sizes),
          "largest_key": specs[int(np.argmax(sizes))].key}


def child(mode: str, src: str, dst: str, shard: str):
  """Runs one direction in this (fresh) process and prints its memory as JSON."""
  from checkpoints_convert import flax_to_hf, hf_to_flax
  baseline = _status("VmRSS")
  t = time.time()
  if mode == "convert":
    hf_to_flax.convert_pipeline(src, dst, log=lambda s: None)
  else:
    flax_to_hf.export(src, dst, max_shard_size=shard, log=lambda s: None)
  print(json.dumps({"baseline_rss": baseline, "peak_rss": _status("VmHWM"), "seconds": time.time() - t}))


def _run_child(mode, src, dst, shard) -> dict:
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, src, dst, shard],
                       check=True, capture_output=True, text=True, cwd=ROOT)
  return json.loads(out.stdout.strip().splitlines()[-1])


def verify(hf_dir: str, back_dir: str) -> int:
  from checkpoints_convert import components, safetensors_stream as st
  name = components.get(COMPONENT).weights_name
  a = st.SafetensorsReader(st.find_weights(os.path.join(hf_dir, COMPONENT), name))
  b = st.SafetensorsReader(st.find_weights(os.path.join(back_dir, COMPONENT), name))
  if set(a.keys()) != set(b.keys()):
    raise AssertionError(f"key sets differ: {sorted(set(a.keys()) ^ set(b.keys()))[:10]}")
  for key in a.keys():
    x, y = a.read(key), b.read(key)
    if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
      raise AssertionError(f"{key} differs after the round trip")
  return len(a)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", default="/tmp/convert_memory_bench")
  p.add_argument("--text_layers", type=int, default=3)
  p.add_argument("--vision_depth", type=int, default=2)
  p.add_argument("--shard", default="1GB", help="shard size of the synthetic and exported safetensors")
  p.add_argument("--keep", action="store_true", help="keep the workdir")
  p.add_argument("--child", nargs=4, metavar=("MODE", "SRC", "DST", "SHARD"), help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child:
    child(*args.child)
    return
  if os.path.exists(args.workdir):
    raise SystemExit(f"{args.workdir} exists; remove it or pass another --workdir")
  hf, out, back = (os.path.join(args.workdir, n) for n in ("hf", "orbax", "hf_back"))
  try:
    t = time.time()
    info = write_synthetic(hf, args.text_layers, args.vision_depth, args.shard)
    print(f"synthetic checkpoint: {info['tensors']} bf16 tensors, {info['total_bytes'] / 2**30:.2f} GiB, "
          f"largest {info['largest_key']} {info['largest_bytes'] / 2**30:.2f} GiB ({time.time() - t:.0f} s)")
    for mode, src, dst in (("convert", hf, out), ("export", out, back)):
      r = _run_child(mode, src, dst, args.shard)
      extra = r["peak_rss"] - r["baseline_rss"]
      print(f"{mode:8s} {r['seconds']:6.1f} s  peak RSS {r['peak_rss'] / 2**30:.2f} GiB "
            f"(baseline after imports {r['baseline_rss'] / 2**30:.2f} GiB, +{extra / 2**30:.2f} GiB)  "
            f"peak/largest {r['peak_rss'] / info['largest_bytes']:.2f}  "
            f"(peak-baseline)/largest {extra / info['largest_bytes']:.2f}  "
            f"peak/total {r['peak_rss'] / info['total_bytes']:.2f}")
    print(f"round trip bit-exact: {verify(hf, back)} tensors")
  finally:
    if not args.keep:
      shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
  main()
