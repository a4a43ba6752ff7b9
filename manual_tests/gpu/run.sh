#!/usr/bin/env bash
# The GPU kit: proves the CUDA and Triton paths on a lent GPU machine in one call of the device
# tool (under its 10-minute limit), with the wheels prepare.sh saved in .whl/ carried along:
#
#   KIT_COMMIT=<hash> bash manual_tests/gpu/run.sh   # there; carry [".whl"]; prepare.sh prints it
#                                                    # (the device's copy may hold stale git metadata)
#   bash manual_tests/gpu/run.sh --dry-run    # here: the same steps on CPU at tiny sizes
#   KIT_COMMIT=<hash> bash manual_tests/gpu/run.sh --sizes   # CREDIT's sizes instead (below)
#
# Steps: install the wheels with --no-index into a private folder and the project beside them
# (the image's torch is left as it is); print the torch/triton/CUDA/GPU versions; the GPU
# kernel tests; benchmarks/gemm.py (det Triton and det CUDA against cuBLAS, bf16 and fp32, at
# 4096^3 and at the projection shapes of the default experiment and of CREDIT's 0.25-degree
# crossformer); `credit train` of the default experiment on one GPU, once in fast mode and twice
# in deterministic mode (steps/s, peak GPU memory, and whether the two deterministic runs hold
# the same bits); benchmarks/determinism.py, deterministic against fast train steps interleaved,
# for each of CREDIT's three classes (nextgen_wxformer, the default experiment's, with its
# time by operation family on the host and on the GPU; wxformer; crossformer); benchmarks/ensemble.py,
# an ensemble's members per second on the GPU. A failing step is reported and the next runs.
#
# Results go to $OUT (default: ./gpu_kit_out), named after the GPU, ready to commit to
# benchmarks/results/: kit_<gpu>.md (versions, steps, tests, training), gemm_<gpu>.md,
# determinism_<gpu>.md (nextgen_wxformer), determinism_<gpu>_wxformer.md,
# determinism_<gpu>_crossformer.md, ensemble_<gpu>.md, kit_<gpu>.log (everything printed). Exit 0 when every step passed.
#
# --sizes: the kit at CREDIT's sizes, within 8 minutes, in this order: benchmarks/step_at_size.py,
# deterministic against fast steps of the three classes at the 1-degree size
# (benchmarks/configs/wxformer_1deg.yml) with the fast step's MFU and one profiled step per mode
# (time by operation family, host and GPU), and the fast step's MFU at 0.25 degrees (its full
# 721 x 1440 grid, batch 1); benchmarks/step_graphs.py, deterministic and fast steps whose
# forward and backward replay a CUDA graph, at 1 degree (wxformer, crossformer; not in the dry
# run); the kernel tests; benchmarks/gemm.py at 4096^3 and at the projection shapes of CREDIT's
# 1-degree and 0.25-degree sections; benchmarks/determinism.py on the default experiment. Files are named after the GPU and the
# commit: sizes_<gpu>_<commit>.md (the report), .log, kernel_tests_, gemm_sizes_, step_1deg_,
# step_0.25deg_, step_graphs_1deg_, determinism_.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD

DRY_RUN=0
SIZES=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        --sizes) SIZES=1 ;;
        *) echo "usage: run.sh [--sizes] [--dry-run]" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-$REPO/gpu_kit_out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
KIT_START=$(date +%s)

# ------------------------------------------------------------------ environment
if (( DRY_RUN )); then
    PYTHON=${PYTHON:-$(command -v python)}
    SITE=""
    DEVICE=cpu
else
    PYTHON=${PYTHON:-python3}
    SITE=$WORK/site
    DEVICE=cuda
fi

GPU_NAME=$("$PYTHON" -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')" 2>/dev/null)
if (( DRY_RUN )); then
    SLUG=cpu_dry_run
elif [ -z "$GPU_NAME" ]; then
    echo "error: no CUDA GPU is visible to $PYTHON's torch; on a machine without one, use --dry-run" >&2
    exit 2
else
    SLUG=$(echo "$GPU_NAME" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9\n' '_' | sed 's/__*/_/g; s/_$//')
fi
COMMIT=${KIT_COMMIT:-$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)}
if (( SIZES )); then
    NAME=${SLUG}_$COMMIT  # every file of a --sizes run: after the GPU and the commit
    SUMMARY=$OUT/sizes_$NAME.md
    LOG=$OUT/sizes_$NAME.log
else
    SUMMARY=$OUT/kit_$SLUG.md
    LOG=$OUT/kit_$SLUG.log
fi
: > "$LOG"
FAILED=()
STEP_ROWS=()
LAST_RC=""  # the last step's exit code, "skipped" when it was not run
VERSIONS="(not read yet)"
KERNEL_RESULT=""
TRAIN_STEPS="?"
TRAIN_TABLE="(not run yet)"
IDENTICAL="not checked yet"

say() { echo "$*" | tee -a "$LOG"; }

# the report, rewritten after every step (what is not measured yet says so)
report() {
    {
        echo "# GPU kit$( ((SIZES)) && echo ' at CREDIT'"'"'s sizes'): ${GPU_NAME:-dry run on CPU}"
        echo
        echo "\`bash manual_tests/gpu/run.sh$( ((SIZES)) && echo ' --sizes')$( ((DRY_RUN)) && echo ' --dry-run')\` at $COMMIT, $(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - KIT_START )) s so far."
        echo
        echo "## Versions"
        echo
        echo '```'
        echo "$VERSIONS"
        echo '```'
        echo
        echo "## Steps"
        echo
        echo "| step | outcome | seconds |"
        echo "| --- | --- | --- |"
        printf '%s\n' "${STEP_ROWS[@]}"
        echo
        echo "Kernel tests: ${KERNEL_RESULT:-no closing line from pytest (not run, or see the log)}"
        echo
        if (( SIZES )); then
            echo "Tables: gemm_sizes_$NAME.md, step_1deg_$NAME.md, step_0.25deg_$NAME.md, step_graphs_1deg_$NAME.md, determinism_$NAME.md; the kernel tests' output: kernel_tests_$NAME.log; everything printed: sizes_$NAME.log."
            for table in step_1deg step_0.25deg step_graphs_1deg; do
                if [ -f "$OUT/${table}_$NAME.md" ]; then
                    echo
                    sed -n '/^| class/,/^$/p' "$OUT/${table}_$NAME.md"
                fi
            done
        else
            echo "## One-GPU training of the default experiment ($TRAIN_STEPS steps)"
            echo
            echo "$TRAIN_TABLE"
            echo
            echo "Two deterministic runs hold the same bits (metrics and every checkpoint tensor): **$IDENTICAL**."
            echo
            echo "GEMM and determinism tables: gemm_$SLUG.md, determinism_$SLUG.md (nextgen_wxformer), determinism_${SLUG}_wxformer.md, determinism_${SLUG}_crossformer.md; everything printed: kit_$SLUG.log."
        fi
    } > "$SUMMARY"
}

# The device tool stops a command at 600 s and returns what $OUT holds then: every step gets
# at most what is left of KIT_BUDGET_S, and the report is rewritten after each step.
# A dry run has no such limit (a loaded CI machine may need longer).
KIT_BUDGET_S=${KIT_BUDGET_S:-$( ((DRY_RUN)) && echo 1800 || echo 570)}

# step NAME TIMEOUT_S COMMAND...: run, log, time, and record the outcome without stopping the kit
step() {
    local name=$1 limit=$2 started rc left
    shift 2
    left=$(( KIT_BUDGET_S - ($(date +%s) - KIT_START) ))
    if (( left < 20 )); then
        FAILED+=("$name")
        STEP_ROWS+=("| $name | **not run**: the kit's ${KIT_BUDGET_S} s were spent | 0 |")
        LAST_RC=skipped
        say "=== $name: not run, ${left}s of the budget left"
        report
        return 0
    fi
    (( limit > left )) && limit=$left
    say ""
    say "=== $name ($(date -u +%H:%M:%S), limit ${limit}s)"
    started=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    LAST_RC=$rc
    local took=$(( $(date +%s) - started ))
    if (( rc == 0 )); then
        STEP_ROWS+=("| $name | passed | $took |")
    else
        FAILED+=("$name")
        STEP_ROWS+=("| $name | **failed** (exit $rc$( ((rc == 124)) && echo ', timed out')) | $took |")
    fi
    say "=== $name: exit $rc after ${took}s"
    report
    return 0
}

install_kit() {
    local before after
    if ! compgen -G ".whl/*.whl" > /dev/null; then
        echo "error: .whl/ holds no wheels: run manual_tests/gpu/prepare.sh on a machine with PyPI and carry [\".whl\"]"
        return 1
    fi
    before=$("$PYTHON" -c "import torch; print(torch.__version__)")
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || return 1
    # the project itself, built from this tree with the image's setuptools; no dependency is
    # resolved, so the image's torch, triton and numpy stay
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
        --target "$SITE" . || return 1
    after=$(PYTHONPATH=$SITE "$PYTHON" -c "import torch; print(torch.__version__)")
    [ "$before" = "$after" ] || { echo "torch changed from $before to $after"; return 1; }
    PYTHONPATH=$SITE "$PYTHON" -c "import credit, hydra, omegaconf, netCDF4, h5netcdf; print('imports ok')"
}

versions() {
    "$PYTHON" - <<'PY'
import platform, subprocess, sys
import numpy, torch
print(f"python {platform.python_version()} ({sys.executable})")
print(f"torch {torch.__version__}, CUDA runtime {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
try:
    import triton
    print(f"triton {triton.__version__}")
except ImportError:
    print("triton: not installed")
print(f"numpy {numpy.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB, "
          f"{p.multi_processor_count} SMs, {torch.cuda.device_count()} visible")
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        print(f"driver {drv}")
    except (OSError, subprocess.SubprocessError):
        print("driver: nvidia-smi not found")
else:
    print("GPU: none visible (dry run on CPU)")
try:
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30).stdout
    print("nvcc", nvcc.strip().splitlines()[-1])
except (OSError, subprocess.SubprocessError, IndexError):
    print("nvcc: not found")
import os
print(f"{os.cpu_count()} CPU cores")
PY
}

if (( DRY_RUN )); then
    say "dry run on CPU: installing skipped, using $PYTHON as it is"
else
        # `step` runs its command under timeout(1), which runs programs, not shell functions
    export -f install_kit
    export PYTHON SITE
    step "install wheels and project (--no-index)" 180 bash -c install_kit
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    export PATH=$SITE/bin:$PATH
fi
CREDIT=("$PYTHON" -m credit.cli)

VERSIONS=$(versions 2>&1)
say ""
say "$VERSIONS"

# ------------------------------------------------------------------ sizes
if (( DRY_RUN )); then
    DATA=$WORK/data
    "${CREDIT[@]}" data generate --out "$DATA" --grid 16x32 --years 2000 2001 --levels 500 850 \
        --train-years 2000 --days-per-year 12 --no-progress >>"$LOG" 2>&1
    # the data and the sizes every CREDIT class shares; nextgen_wxformer's own key apart
    SMALL=(data.root="$DATA" data.generate_if_missing=false "data.levels=[500,850]"
           "data.train_period=[2000-01-01,2000-01-12]" "data.valid_period=[2001-01-01,2001-01-12]"
           data.valid_samples=4 trainer.batch_size=4 "model.dim=[8,16,32,64]" model.dim_head=4)
    EXPERIMENT=("${SMALL[@]}" model.num_spectral_nodes=4)
    TRAIN_STEPS=4
    KERNEL_TESTS=(--collect-only -q tests/kernels/test_gemm_gpu.py)
    GEMM=(--backends cpu,triton,cuda --dtypes float32 --threads 1 --repeat 1 --min-time 0.001
          --shapes experiment)
    DET_STEPS=2
else
    DATA=$WORK/data  # the default experiment's embedded dataset, generated by the first run
    EXPERIMENT=(data.root="$DATA")
    SMALL=("${EXPERIMENT[@]}")
    TRAIN_STEPS=100  # 200 left benchmarks/gemm.py no time within a 550 s budget on an H100 and an H200
    KERNEL_TESTS=(-q -rs -p no:cacheprovider tests/kernels/test_gemm_gpu.py tests/kernels/test_gemm_api.py)
    GEMM=(--backends triton,cuda --dtypes bfloat16,float32 --repeat 3 --min-time 0.01
          --shapes gpu-square,experiment,credit:benchmarks/configs/wxformer_0.25deg.yml)
    DET_STEPS=12
fi
SECTION_1DEG=benchmarks/configs/wxformer_1deg.yml
SECTION_025DEG=benchmarks/configs/wxformer_0.25deg.yml
STEP_AT_SIZE=(--steps 6)
if (( SIZES && DRY_RUN )); then
    # the 1-degree section shrunk to a grid, widths, head size, depth and levels a CPU steps
    # in seconds (its 79 input channels and two blocks a stage took 1.8x as long)
    SECTION_1DEG=$WORK/tiny_section.yml
    SECTION_025DEG=$SECTION_1DEG
    "$PYTHON" - "$SECTION_1DEG" <<'PY' >>"$LOG" 2>&1
import sys, yaml
conf = yaml.safe_load(open("benchmarks/configs/wxformer_1deg.yml"))
conf["model"].update(image_height=40, image_width=40, dim=[8, 16, 32, 64], dim_head=4, depth=[1, 1, 1, 1], levels=2)
conf["model"]["padding_conf"].update(pad_lat=[12, 12], pad_lon=[12, 12])
yaml.safe_dump(conf, open(sys.argv[1], "w"))
PY
    STEP_AT_SIZE=(--steps 1)
    GEMM=(--backends cpu,triton --dtypes float32 --threads 1 --repeat 1 --min-time 0.001 --whole-k
          --shapes "credit:$SECTION_1DEG")
elif (( SIZES )); then
    GEMM=(--backends triton --dtypes bfloat16,float32 --repeat 3 --min-time 0.01 --whole-k
          --shapes "gpu-square,credit:$SECTION_1DEG,credit:$SECTION_025DEG")
fi
TRAIN_COMMON=("${EXPERIMENT[@]}" trainer.device=$DEVICE trainer.max_steps=$TRAIN_STEPS
              trainer.progress_bar=false trainer.resume=never)

# ------------------------------------------------------------------ the steps
# the CPU dry run shares two cores with the rest of the suite: more time than a GPU needs
TRAIN_LIMIT=$( ((DRY_RUN)) && echo 480 || echo 150)
kernel_tests() {
    step "kernel tests" $( ((DRY_RUN)) && echo 480 || echo 200) "$PYTHON" -m pytest "${KERNEL_TESTS[@]}"
    # pytest's closing line, from the kernel tests' own part of the log
    KERNEL_RESULT=$(sed -n '/^=== kernel tests (/,/^=== kernel tests:/p' "$LOG" \
        | grep -E "[0-9]+ (passed|failed|skipped|errors?)|tests? collected" | tail -n 1)
}

if (( SIZES )); then  # the step figures first: a lease can end before the kernel tests do
    SIZE_LIMIT=$( ((DRY_RUN)) && echo 480 || echo 150)
    # the first deterministic step compiles the Triton kernels: 150 s was too short on an H200
    step "benchmarks/step_at_size.py 1 degree, three classes" $( ((DRY_RUN)) && echo 480 || echo 300) \
        "$PYTHON" benchmarks/step_at_size.py --section "$SECTION_1DEG" --models wxformer,crossformer,nextgen_wxformer \
        --device $DEVICE "${STEP_AT_SIZE[@]}" --profile 1 --out "$OUT/step_1deg_$NAME.md"
    step "benchmarks/step_at_size.py 0.25 degree, fast" "$SIZE_LIMIT" "$PYTHON" benchmarks/step_at_size.py \
        --section "$SECTION_025DEG" --modes fast --device $DEVICE "${STEP_AT_SIZE[@]}" \
        --out "$OUT/step_0.25deg_$NAME.md"
    if (( DRY_RUN )); then  # CUDA graphs: nothing to capture on a CPU
        STEP_ROWS+=("| benchmarks/step_graphs.py 1 degree | not run: captures CUDA graphs, needs a GPU | 0 |")
    else
        step "benchmarks/step_graphs.py 1 degree" "$SIZE_LIMIT" "$PYTHON" benchmarks/step_graphs.py \
            --section "$SECTION_1DEG" --models wxformer,crossformer "${STEP_AT_SIZE[@]}" \
            --out "$OUT/step_graphs_1deg_$NAME.md"
    fi
    kernel_tests
    sed -n '/^=== kernel tests (/,/^=== kernel tests:/p' "$LOG" > "$OUT/kernel_tests_$NAME.log"
    step "benchmarks/gemm.py" 150 "$PYTHON" benchmarks/gemm.py "${GEMM[@]}" --out "$OUT/gemm_sizes_$NAME.md"
    # last: the default experiment's figure is on record, and a lease can end first
    step "benchmarks/determinism.py" "$SIZE_LIMIT" "$PYTHON" benchmarks/determinism.py --device $DEVICE \
        --steps $DET_STEPS --out "$OUT/determinism_$NAME.md" "${EXPERIMENT[@]}"
    report
    cat "$SUMMARY"
    if (( ${#FAILED[@]} )); then
        echo "failed steps: ${FAILED[*]}" >&2
        exit 1
    fi
    exit 0
fi
kernel_tests

step "train fast" "$TRAIN_LIMIT" "${CREDIT[@]}" train "${TRAIN_COMMON[@]}" model.gemm=fast run_dir="$WORK/fast"
step "train deterministic (1)" "$TRAIN_LIMIT" "${CREDIT[@]}" train "${TRAIN_COMMON[@]}" model.gemm=deterministic \
    run_dir="$WORK/det1"
step "train deterministic (2)" "$TRAIN_LIMIT" "${CREDIT[@]}" train "${TRAIN_COMMON[@]}" model.gemm=deterministic \
    run_dir="$WORK/det2"
step "deterministic runs hold the same bits" 120 "$PYTHON" manual_tests/determinism/compare_runs.py \
    "$WORK/det1" "$WORK/det2"
case $LAST_RC in
    0) IDENTICAL=yes ;;
    skipped) IDENTICAL="not checked (out of time)" ;;
    *) IDENTICAL="no (or a run is missing: see the log)" ;;
esac
TRAIN_TABLE=$("$PYTHON" manual_tests/gpu/train_summary.py fast="$WORK/fast" det1="$WORK/det1" \
    det2="$WORK/det2" 2>&1)

# deterministic against fast on each of CREDIT's classes; the CPU dry run shares two cores
# with the rest of the suite: more time than a GPU needs
DET_LIMIT=$( ((DRY_RUN)) && echo 480 || echo 150)
# the default experiment's also profiled: host and kernel time by operation family
step "benchmarks/determinism.py" "$DET_LIMIT" "$PYTHON" benchmarks/determinism.py --device $DEVICE \
    --steps $DET_STEPS --profile 2 --out "$OUT/determinism_$SLUG.md" "${EXPERIMENT[@]}"
for class in wxformer crossformer; do
    step "benchmarks/determinism.py model=$class" "$DET_LIMIT" "$PYTHON" benchmarks/determinism.py \
        --device $DEVICE --steps $DET_STEPS --model $class --out "$OUT/determinism_${SLUG}_$class.md" \
        "${SMALL[@]}"
done

GEMM_OVERRIDES=()
for o in "${EXPERIMENT[@]}"; do GEMM_OVERRIDES+=(--override "$o"); done
step "benchmarks/gemm.py" 300 "$PYTHON" benchmarks/gemm.py \
    "${GEMM[@]}" "${GEMM_OVERRIDES[@]}" --out "$OUT/gemm_$SLUG.md"
# an ensemble's members per second on one GPU (one rank a GPU: the placements over ranks need more)
step "benchmarks/ensemble.py" $( ((DRY_RUN)) && echo 180 || echo 90) "$PYTHON" benchmarks/ensemble.py --ranks 1 \
    --steps $( ((DRY_RUN)) && echo 3 || echo 10) --device $DEVICE --out "$OUT/ensemble_$SLUG.md"

report
cat "$SUMMARY"
if (( ${#FAILED[@]} )); then
    echo "failed steps: ${FAILED[*]}" >&2
    exit 1
fi
