#!/usr/bin/env bash
# bench/'s speed benchmarks on one NVIDIA GPU, both sides there (torch on CUDA, `bench/accel.py`), in bfloat16,
# our DiT with cuDNN's attention beside XLA's:
#
#   bash bench/gpu.sh [OUT_DIR]        (default /tmp/glmrl_gpu_bench)
#
# First GLM-Image at its released size (`bench/fullsize.py`: the AR sampler against the HBM roofline, the 1024^2 DiT
# decode against diffusers, a training step of the LoRA and decoupled recipes, whose compile report's peak is set
# beside the measured one; about 10 minutes on an H100), then the
# AR sampler b=1/8/16 against transformers `generate`; one DiT CFG step of 2 layers at the released width at
# 1024^2 against diffusers; the decoder update per trained timestep against diffusers + PEFT. Each bench's output
# also goes to OUT_DIR/<bench>.txt. Needs jax with its CUDA plugin, torch with CUDA, and requirements-test.txt's
# other packages. A bench that fails is reported and the others still run; the exit status counts the failures.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/glmrl_gpu_bench}
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch and JAX share the card: JAX must not take 75% of it up front
export PYTHONUNBUFFERED=1
failed=0

run() {
  local name=$1
  shift
  echo "== $name: $*"
  if ! "$@" 2>&1 | tee "$out/$name.txt"; then
    echo "== $name FAILED"
    failed=$((failed + 1))
  fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import jax, torch; print('jax', jax.__version__, jax.devices(), '| torch', torch.__version__,
torch.cuda.get_device_name())" | tee -a "$out/gpu.txt"
# The train stage's recipes also compiled for this GPU's kind (`--mode=compile` on the host's CPU, after the
# measured steps): the compile report's peak per GPU beside the measured one.
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) target=h200-1 ;;
  *H100*) target=h100-1 ;;
  *) target= ;;
esac
run fullsize_train python3 bench/fullsize.py --stages=train${target:+,compile} ${target:+--compile_topology=$target} \
  --out="$out/fullsize_train"
run fullsize python3 bench/fullsize.py --stages=ar,dit --out="$out/fullsize"
run ar_sampler python3 bench/ar_sampler.py --dtype bfloat16 --batches 1,8,16
run dit_step python3 bench/dit_step.py --dtype bfloat16 --attention xla,cudnn --layers 2 --heads 64 --head_dim 40 \
  --latent 128 --text_len 128 --batch 2 --reps 5
run decoder_update python3 -m bench.decoder_update --dtype bfloat16 --attention cudnn --layers 4 --heads 16 \
  --head_dim 64 --size 512 --batch 4 --text_len 64 --windows 1,4 --steps 4 --window 1 --reps 5
exit $failed
