#!/usr/bin/env bash
# One GPU session: the CUDA checks (tests marked `cuda`: bf16, SDPA and xformers, the fused rotary kernel), the GPU
# benchmarks, and the mini-world training.
#   OUT=outputs/gpu bash scripts/gpu_checks.sh
# Carried wheels in .whl/ (diffusers, xformers, ...) are installed first when present. Phase A runs the CUDA tests
# (`pytest -m cuda tests/cuda`, one part per file) while the mini-world models train in the background; phase B
# runs the benchmarks (benchmarks/) after training, so that their timings have the GPU to themselves. Each part
# has its own time limit and a failure is reported without stopping the others. $OUT receives gpu_checks.log,
# results.tar (JSON and logs of every part, re-packed after each part) and the world-*.tar checkpoints.
set -u
export PYTHONUNBUFFERED=1 MMPOS_TRITON=1  # default rotary backend "auto" (mmpos.ops.set_rotary_backend): the fused kernel is checked and timed against the PyTorch path
OUT=${OUT:-outputs/gpu}
export OUT
RESULTS=$(mktemp -d)/results
mkdir -p "$OUT" "$RESULTS"
export MMPOS_CUDA_OUT=$RESULTS  # the CUDA tests write their JSON here
exec > >(tee "$OUT/gpu_checks.log") 2>&1
T0=$SECONDS

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    || export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, diffusers; print('torch', torch.__version__, 'diffusers', diffusers.__version__)"

part() {  # part NAME SECONDS COMMAND... (skipped when the command's script is not in this checkout)
    local name=$1 limit=$2; shift 2
    for arg in "$@"; do
        case $arg in scripts/*|benchmarks/*|tests/*) [ -f "$arg" ] || { echo "=== $name: $arg missing, skipped"; return; } ;; esac
    done
    echo "=== $name (limit ${limit}s, t=$((SECONDS - T0))s)"
    local start=$SECONDS
    timeout -k 5 "$limit" "$@" 2>&1 | grep -v "Model config"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s"
    tar -cf "$OUT/results.tar" -C "$(dirname "$RESULTS")" results
}

if [ -f scripts/gpu_train_world.sh ]; then
    WORLD_TIMEOUT_VAE=${WORLD_TIMEOUT_VAE:-100} WORLD_TIMEOUT_MODEL=${WORLD_TIMEOUT_MODEL:-200} \
        bash scripts/gpu_train_world.sh > "$RESULTS/train_world.log" 2>&1 &
    TRAIN_PID=$!
fi

echo "##### phase A: correctness (mini-world training runs alongside)"
CUDA_TESTS=(python3 -m pytest -m cuda -p no:cacheprovider -q -rA -s)  # + one file of tests/cuda, tables printed
part check_cuda 100 "${CUDA_TESTS[@]}" tests/cuda/test_encodings_cuda.py
part backbones_check 60 "${CUDA_TESTS[@]}" tests/cuda/test_backbones_cuda.py
part diffusers_check 90 "${CUDA_TESTS[@]}" tests/cuda/test_diffusers_cuda.py
part variants_check 60 "${CUDA_TESTS[@]}" tests/cuda/test_variants_cuda.py
part edit_check 70 "${CUDA_TESTS[@]}" tests/cuda/test_edit_cuda.py
part multimodal_rope_check 80 "${CUDA_TESTS[@]}" tests/cuda/test_multimodal_rope_cuda.py

if [ -n "${TRAIN_PID:-}" ]; then
    echo "=== waiting for training (t=$((SECONDS - T0))s)"; wait "$TRAIN_PID"; echo "=== training exit $?"
    tail -n 40 "$RESULTS/train_world.log"
fi

echo "##### phase B: benchmarks (GPU to themselves)"
part bench_rotary 75 python3 benchmarks/bench_rotary.py --device cuda --repeats 20 --out "$RESULTS/bench_rotary_cuda.json"
part bench_variants 60 python3 benchmarks/bench_variants.py --device cuda --out "$RESULTS/bench_variants_cuda.json"
part bench_flux 50 python3 benchmarks/bench_backbones.py --part flux --device cuda --rounds 5 \
    --out "$RESULTS/bench_backbones_flux_cuda.json"
part bench_vit 60 python3 benchmarks/bench_backbones.py --part vit --device cuda --dtype bf16 --rounds 3 --repeats 3 \
    --out "$RESULTS/bench_backbones_vit_cuda.json"
part bench_edit 60 python3 benchmarks/bench_edit.py --device cuda --dtype bf16 --size flux1024 \
    --out "$RESULTS/bench_edit_cuda.json"
part bench_multimodal_rope 60 python3 benchmarks/bench_multimodal_rope.py --device cuda --dtypes bf16 --repeats 10 \
    --out "$RESULTS/bench_multimodal_rope_cuda.json"
for extra in scripts/gpu_parts/*.sh; do  # further parts (each takes the results folder)
    [ -f "$extra" ] && part "$(basename "$extra" .sh)" 100 bash "$extra" "$RESULTS"
done
cp outputs/*cuda*.json "$RESULTS/" 2>/dev/null
tar -cf "$OUT/results.tar" -C "$(dirname "$RESULTS")" results
echo "total $((SECONDS - T0)) s"; ls -la "$OUT"
