#!/usr/bin/env bash
# Recompiles the committed --mode=compile reports (docs/compile_reports/*.json) and regenerates their tables
# (docs/reference/fits.md). Rows: docs/compile_reports.py's ROWS; name some to recompile only those:
#   bash docs/compile_reports.sh t2i-v5p-64 lora-v5p-2
# Needs requirements-compile.txt (libtpu) for the TPU rows, requirements-compile-gpu.txt for the GPU rows; no TPU
# or GPU. Slow: minutes to tens of minutes per row on a few CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
nice -n 19 python docs/compile_reports.py compile "$@"
