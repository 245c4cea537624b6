#!/usr/bin/env bash
# One GPU session: CUDA correctness (bf16, SDPA and xformers) and GPU benchmarks of every part of mmpos.
#   OUT=outputs/gpu bash scripts/gpu_checks.sh
# Carried wheels in .whl/ (diffusers, xformers, ...) are installed first when present. Each part runs
# under its own time limit and a failure is reported without stopping the others. Everything lands in
# $OUT: gpu_checks.log and results.tar (JSON of each part), plus what the training part packs.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-outputs/gpu}
mkdir -p "$OUT/results"
LOG="$OUT/gpu_checks.log"
exec > >(tee "$LOG") 2>&1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, diffusers; print('torch', torch.__version__, 'diffusers', diffusers.__version__)"

part() {  # part NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    local start=$SECONDS
    timeout "$limit" "$@"; local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
}

# Background training first (it has its own wall-clock limit), then the checks alongside it.
if [ -f scripts/gpu_train_world.sh ]; then
    bash scripts/gpu_train_world.sh "$OUT" > "$OUT/results/train_world.log" 2>&1 &
    TRAIN_PID=$!
fi

part check_cuda 120 python3 scripts/check_cuda.py --out "$OUT/results/check_cuda.json"
part bench_rotary 150 python3 scripts/bench_rotary.py --device cuda --repeats 20 --out "$OUT/results/bench_rotary_cuda.json"
for extra in scripts/gpu_parts/*.sh; do
    [ -f "$extra" ] && part "$(basename "$extra" .sh)" 120 bash "$extra" "$OUT/results"
done

if [ -n "${TRAIN_PID:-}" ]; then
    echo "=== waiting for training"; wait "$TRAIN_PID"; echo "=== training exit $?"
    tail -n 30 "$OUT/results/train_world.log"
fi
tar -cf "$OUT/results.tar" -C "$OUT" results && rm -rf "$OUT/results"
ls -la "$OUT"
