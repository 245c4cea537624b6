#!/usr/bin/env bash
# The whole novel-view benchmark on CPU: data, 5 encodings x 3 seeds (2 processes, one thread each), report.
# Usage: bash scripts/nvs_benchmark.sh [outputs/nvs] [steps]   (resumes unfinished runs; ~35 CPU minutes)
set -euo pipefail
OUT=${1:-outputs/nvs}
STEPS=${2:-450}
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1
[ -f "$OUT/data.pt" ] || $PY scripts/eval_nvs.py --out "$OUT" data
queue() {
  for job in "$@"; do
    $PY scripts/eval_nvs.py --out "$OUT" train --encoding "${job%:*}" --seed "${job#*:}" --steps "$STEPS"
  done
}
queue rayrope:0 none:0 prope:0 plucker:1 ucpe:1 rayrope:2 none:2 prope:2 > "$OUT/queue_a.log" 2>&1 &
queue ucpe:0 plucker:0 rayrope:1 none:1 prope:1 ucpe:2 plucker:2 > "$OUT/queue_b.log" 2>&1 &
wait
$PY scripts/eval_nvs.py --out "$OUT" report --figure assets/nvs/examples.png
