#!/usr/bin/env bash
# The whole novel-view benchmark on CPU: data, 5 encodings x 3 seeds (2 processes, one thread each) trained 450
# steps, then continued 350 steps at half the learning rate, then the report (~33 CPU minutes in all).
# Usage: bash scripts/nvs_benchmark.sh [outputs/nvs]   (resumes unfinished runs)
set -euo pipefail
OUT=${1:-outputs/nvs}
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1
[ -f "$OUT/data.pt" ] || $PY scripts/eval_nvs.py --out "$OUT" data
queue() {  # queue STAGE_ARGS... -- JOBS...
  local stage=()
  while [ "$1" != "--" ]; do stage+=("$1"); shift; done; shift
  for job in "$@"; do  # --resume: continue the run if it has a checkpoint (else start it)
    $PY scripts/eval_nvs.py --out "$OUT" "${stage[@]:0:2}" train --encoding "${job%:*}" --seed "${job#*:}" \
      "${stage[@]:2}" --resume
  done
}
A="rayrope:0 none:0 prope:0 plucker:1 ucpe:1 rayrope:2 none:2 prope:2"
B="ucpe:0 plucker:0 rayrope:1 none:1 prope:1 ucpe:2 plucker:2"
FIRST=(--checkpoints checkpoints --steps 450)
SECOND=(--checkpoints continued --steps 350 --lr 5e-4 --warmup 20 --init-from checkpoints)
for stage in FIRST SECOND; do
  declare -n args=$stage
  queue "${args[@]}" -- $A > "$OUT/queue_a_$stage.log" 2>&1 &
  queue "${args[@]}" -- $B > "$OUT/queue_b_$stage.log" 2>&1 &
  wait
done
$PY scripts/eval_nvs.py --out "$OUT" --checkpoints continued report --figure assets/nvs/examples.png --overwrite
