#!/usr/bin/env bash
# Train the mini-world models on one GPU in under 6 minutes and pack one tar per model into $OUT.
#   OUT=/some/dir bash scripts/gpu_train_world.sh
# VAE first (~1.5 min), then t2i, fill and kontext as three processes sharing the GPU (~3.7 min).
# Every trainer stops on its own clock (max_minutes in configs/world/*.yaml); `timeout` is a backstop whose
# SIGTERM ends training early but still exports. WORLD_EXTRA adds train_world.py flags (CPU smoke test:
# WORLD_EXTRA="--device cpu --max-steps 2 --num-examples 64 --batch-size 4 --workers 1 --num-samples 2 --sample-steps 2"
# WORLD_TIMEOUT_VAE=900 WORLD_TIMEOUT_MODEL=900 WORLD_PRECISION=no).
set -euo pipefail
: "${OUT:?set OUT to the folder that receives the tar files}"
PY=${PYTHON:-python3}
PRECISION=${WORLD_PRECISION:-bf16}
WORK=$(mktemp -d)/world
mkdir -p "$WORK" "$OUT"
read -r -a EXTRA <<< "${WORLD_EXTRA:-}"
start=$(date +%s)

timeout -k 20 "${WORLD_TIMEOUT_VAE:-110}" "$PY" scripts/train_world.py --config configs/world/vae.yaml --out "$WORK" --quiet \
    --mixed-precision "$PRECISION" ${EXTRA[@]+"${EXTRA[@]}"} 2>&1 | tee "$WORK/log-vae.txt" | grep -v "^\[vae\] step" || true
tail -n 3 "$WORK/log-vae.txt" | grep -v '^{' || true
echo "vae done after $(( $(date +%s) - start )) s"

pids=()
for task in t2i fill kontext; do
    timeout -k 20 "${WORLD_TIMEOUT_MODEL:-225}" "$PY" scripts/train_world.py --config "configs/world/$task.yaml" --out "$WORK" --vae "$WORK" \
        --quiet --mixed-precision "$PRECISION" ${EXTRA[@]+"${EXTRA[@]}"} > "$WORK/log-$task.txt" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
echo "transformers done after $(( $(date +%s) - start )) s (exit status $status)"

for model in vae t2i fill kontext; do
    echo "== $model: losses (step loss)"
    grep "^\[$model\] step" "$WORK/log-$model.txt" | awk '{printf "%s:%s ", $3, $5} END {print ""}' || true
    grep '^{' "$WORK/log-$model.txt" || tail -n 20 "$WORK/log-$model.txt"
    if [ -d "$WORK/world-$model" ]; then
        tar -cf "$OUT/world-$model.tar" -C "$WORK" "world-$model"
    fi
done
tar -czf "$OUT/world-logs.tar.gz" -C "$WORK" $(cd "$WORK" && ls log-*.txt)
ls -l "$OUT"
echo "total $(( $(date +%s) - start )) s"
