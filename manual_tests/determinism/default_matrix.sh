#!/usr/bin/env bash
# Deterministic mode on the default experiment (default model, embedded data, global batch 8,
# dropout 0.1 on attention and feed-forward, EMA on): train STEPS steps in one process and at
# (dp, tp) = (1,2), (1,4), (2,1), (2,2), (4,1), then compare each run's per-step losses, every
# other metrics.csv value and every tensor of its final checkpoint (model, EMA, optimizer)
# with one process's, bitwise.  Usage: manual_tests/determinism/default_matrix.sh [STEPS] [OUT]
# [KEY=VALUE ...] (trailing overrides apply to every run, e.g. model=windowformer)
set -euo pipefail
steps=${1:-30}
out=${2:-runs/determinism_matrix}
extra=("${@:3}")
export OMP_NUM_THREADS=1
common=(model.gemm=deterministic model.attn_dropout=0.1 model.ff_dropout=0.1 trainer.ema.enabled=true
        trainer.max_steps=$steps trainer.valid_every_n_steps=0 trainer.checkpoint.every_n_steps=0
        trainer.progress_bar=false trainer.resume=never trainer.parallelism.data=fsdp2 "${extra[@]}")
run() {  # name nproc batch_per_rank tensor
  credit train --nproc "$2" "${common[@]}" trainer.batch_size="$3" trainer.parallelism.tensor="$4" \
    run_dir="$out/$1" > "$out/$1.log" 2>&1
}
mkdir -p "$out"
run dp1_tp1 1 8 1
for layout in "dp1_tp2 2 8 2" "dp1_tp4 4 8 4" "dp2_tp1 2 4 1" "dp2_tp2 4 4 2" "dp4_tp1 4 2 1"; do
  set -- $layout
  run "$1" "$2" "$3" "$4"
  printf '%s: ' "$1"
  python manual_tests/gen2_parallelism/check_parity.py "$out/dp1_tp1" "$out/$1" --exact || true
  { python manual_tests/determinism/compare_runs.py "$out/dp1_tp1" "$out/$1" || true; } | sed "s/^/  /"
done
