#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one short run:
#
#   bash tests/gpu.sh
#
# 1. The GPU-only tests (cuDNN's attention in bfloat16; skipped elsewhere) and the on-policy tests (the flow ratio, the
#    sampler against the learner's log-probs with top-k and top-p, which once failed on an H200:
#    docs/benchmarks.md), with float32 matmuls at full precision (XLA:GPU's default would round them to TF32,
#    which the float32 tolerances are not meant for);
# 2. main.py as a GPU user runs it: the released t2i recipe's tiny config in bfloat16 with
#    `model.dit_attention=auto` (cuDNN), two steps.
# 3. `bench/fullsize.py --size=tiny`: the full-size benchmark's every stage at the tiny size, on the GPU.
# `bash bench/gpu.sh` then measures speed.
# A failing step is reported and the next still runs; the exit status counts the failures.
set -uo pipefail
cd "$(dirname "$0")/.."
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest PYTHONUNBUFFERED=1
failed=0
python3 -m pytest -q -p no:cacheprovider tests/models/dit/test_attention.py tests/grpo/test_flow.py \
  tests/sampling/test_logprobs.py -k "cudnn or on_policy" || failed=$((failed + 1))
workdir=$(mktemp -d)
if python3 main.py --config=configs/glm_image_t2i.py:tiny --config.model.compute_dtype=bfloat16 \
    --config.model.dit_attention=auto --config.train.num_steps=2 --config.log.image_interval=0 --workdir="$workdir"; then
  echo "main.py: $(wc -l < "$workdir/metrics.jsonl") metric rows in $workdir"
else
  echo "main.py FAILED"
  failed=$((failed + 1))
fi
python3 bench/fullsize.py --size=tiny --reps=1 --train_steps=1 --out="$(mktemp -d)" || failed=$((failed + 1))
exit $failed
