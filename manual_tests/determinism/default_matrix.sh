#!/usr/bin/env bash
# Deterministic mode on the default experiment (default model, embedded data, global batch 8,
# dropout 0.1 on attention and feed-forward, EMA on): train STEPS steps in one process and at
# (dp, tp) = (1,2), (1,4), (2,1), (2,2), (4,1), then compare each run's per-step losses, every
# other metrics.csv value and every tensor of its final checkpoint (model, EMA, optimizer)
# with one process's, bitwise.  Usage: manual_tests/determinism/default_matrix.sh [STEPS] [OUT]
set -euo pipefail
steps=${1:-30}
out=${2:-runs/determinism_matrix}
export OMP_NUM_THREADS=1
common=(model.gemm=deterministic model.attn_dropout=0.1 model.ff_dropout=0.1 trainer.ema.enabled=true
        trainer.max_steps=$steps trainer.valid_every_n_steps=0 trainer.checkpoint.every_n_steps=0
        trainer.progress_bar=false trainer.resume=never trainer.parallelism.data=fsdp2)
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
  python manual_tests/gen2_parallelism/check_parity.py "$out/dp1_tp1" "$out/$1" --exact
  python - "$out/dp1_tp1" "$out/$1" <<'PY'
import csv, sys, tempfile
from pathlib import Path
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

def rows(run):
    with open(Path(run) / "metrics.csv") as f:
        return [{k: v for k, v in r.items() if k != "samples_per_s"} for r in csv.DictReader(f)]

def tensors(run, scratch):
    ckpt = max(p for p in (Path(run) / "checkpoints").glob("step_*") if p.name[5:].isdigit())
    dcp_to_torch_save(ckpt, f"{scratch}/state.pt")
    flat = {}
    def walk(prefix, value):
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value
    walk("", torch.load(f"{scratch}/state.pt", weights_only=False))
    return flat

print("  every metrics.csv value (grad norms, lr, validation):",
      "identical" if rows(sys.argv[1]) == rows(sys.argv[2]) else "DIFFERENT")
with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
    ref, got = tensors(sys.argv[1], a), tensors(sys.argv[2], b)
same = sorted(ref) == sorted(got) and all(torch.equal(ref[k], got[k]) for k in ref)
print(f"  final checkpoint ({len(ref)} tensors: model, EMA, optimizer):", "bitwise" if same else "DIFFERENT")
PY
done
