#!/usr/bin/env bash
# Issue 6b: MRoPE / MRoPE-I / MHRoPE / VRoPE on CUDA (bf16 vs fp64 CPU, ids, tiny Qwen-VL models) and their
# benchmark. Usage: bash scripts/gpu_parts/multimodal_rope.sh OUT_DIR   (JSON files land in OUT_DIR)
python3 scripts/gpu_check_multimodal_rope.py --device "${DEVICE:-cuda}" --out-dir "${1:-outputs/gpu}" 2>&1 | grep -v "Model config"
exit "${PIPESTATUS[0]}"
