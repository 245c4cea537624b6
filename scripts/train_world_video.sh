#!/usr/bin/env bash
# The world video model on CPU, as shipped in assets/world-video: VAE fine-tune, base video transformer, then the
# ucpe and plucker camera adapters in parallel (one thread each), export, and the camera-following evaluation.
# Usage: bash scripts/train_world_video.sh [runs/video] [assets/world-video]   (resumes unfinished stages)
set -euo pipefail
RUNS=${1:-runs/video}
MODEL=${2:-assets/world-video}
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1
stage() {  # stage NAME ARGS...: train (or resume) one stage into RUNS/NAME
  local name=$1; shift
  mkdir -p "$RUNS/$name"
  [ -f "$RUNS/$name/clips-train.pt" ] || [ ! -f "$RUNS/vae/clips-train.pt" ] || \
    ln -sf "$(cd "$RUNS/vae" && pwd)/clips-train.pt" "$RUNS/$name/clips-train.pt"
  $PY scripts/train_world_video.py --stage "$name" --out "$RUNS/$name" --threads 1 --resume "$@"
}
stage vae --steps 1500 --batch-size 32 --lr 1e-3
stage base --vae "$RUNS/vae/vae" --steps 3000
for kind in ucpe plucker; do
  stage "$kind" --vae "$RUNS/vae/vae" --base "$RUNS/base/transformer" --steps 1200 --checkpoint-every 100 > "$RUNS/$kind.log" 2>&1 &
done
wait
$PY scripts/export_world_video.py --runs "$RUNS" --out "$MODEL" --overwrite
$PY scripts/eval_camera_following.py --model "$MODEL" --scenes 8 --out outputs/camera_following --overwrite
