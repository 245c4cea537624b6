#!/usr/bin/env bash
# GPU part (run by scripts/gpu_checks.sh with the results folder as $1; standalone: bash this.sh outputs/gpu):
# camera encodings (plucker, prope, ucpe, rayrope) in bf16 on CUDA vs fp64 on the CPU, then attention time with
# each encoding vs plain SDPA at tiny, LVSM (3 views x 32x32, RayRoPE) and Wan-1.3B (21 x 30x52) shapes.
RESULTS=${1:-outputs/gpu}
mkdir -p "$RESULTS"
python3 benchmarks/bench_camera.py --device cuda --check --shapes tiny lvsm wan1.3b --repeats 10 \
    --out "$RESULTS/bench_camera_cuda.json"
