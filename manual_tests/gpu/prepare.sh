#!/usr/bin/env bash
# Here, on a machine that reaches PyPI: wheels of every runtime dependency the GPU image lacks,
# for its Python 3.12 on manylinux x86_64, into the git-ignored .whl/ at the repository's root.
# It prints the `carry` list for the device tool's run of manual_tests/gpu/run.sh.
#
#   bash manual_tests/gpu/prepare.sh
#
# The image has torch, triton, numpy, xarray, h5py, pandas, PyYAML, tqdm, matplotlib, ninja,
# pytest and pytest-xdist; it lacks the names below. Each is pinned to the version installed in
# this checkout's .venv (the one the suite passed with) when there is one, else the newest.
set -euo pipefail
cd "$(dirname "$0")/../.."

# zarr and its codecs (10 MiB) are left out: the kit's data is netCDF, and the checkout's
# tracked files (49 MiB) leave the wheels about 15 of the 64 MiB a call carries
MISSING=(hydra-core omegaconf antlr4-python3-runtime netCDF4 cftime h5netcdf)
DEST=.whl
LIMIT_MIB=64  # what the device tool carries with the working tree, at most
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
           manylinux1_x86_64 manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64)
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done

rm -rf "$DEST"
mkdir -p "$DEST"
for name in "${MISSING[@]}"; do
    version=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    spec=$name${version:+==$version}
    if ! "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp "${platform_args[@]}" -d "$DEST" "$spec" 2>/dev/null; then
        # no binary wheel on PyPI (antlr4-python3-runtime ships an sdist only): build the
        # pure-Python wheel here, which installs on any Python 3
        "$PYTHON" -m pip wheel -q --no-deps -w "$DEST" "$spec"
    fi
    wheel=$(ls "$DEST" | grep -i "^$(echo "$name" | tr - _)-" | head -n 1 || true)
    [ -n "$wheel" ] || { echo "error: no wheel of $spec was saved in $DEST" >&2; exit 1; }
    if [[ $wheel != *none-any.whl && $wheel != *cp312* && $wheel != *abi3* ]]; then
        echo "error: $wheel does not install on CPython 3.12" >&2
        exit 1
    fi
done

size_mib=$(( ($(du -sb "$DEST" | cut -f1) + 1048575) / 1048576 ))
echo "saved $(ls "$DEST" | wc -l) wheels, ${size_mib} MiB, in $DEST/:"
ls "$DEST" | sed 's/^/  /'
# what travels: the tracked files and the untracked ones git does not ignore, and the wheels
tree_bytes=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -cb --files0-from=- 2>/dev/null \
    | tail -n 1 | cut -f1)
tree_mib=$(( (tree_bytes + 1048575) / 1048576 ))
if (( size_mib + tree_mib > LIMIT_MIB )); then
    echo "error: $DEST holds ${size_mib} MiB and the working tree ${tree_mib} MiB; the device tool carries" \
         "${LIMIT_MIB} MiB at most" >&2
    exit 1
fi
echo "with the working tree (${tree_mib} MiB): $(( size_mib + tree_mib )) of the ${LIMIT_MIB} MiB a call carries"
echo
echo 'carry: [".whl"]'
# the device's copy of the tree may carry stale git metadata: name the commit in the command
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.whl' 2>/dev/null || echo '+changes')
echo "command: KIT_COMMIT=$commit bash manual_tests/gpu/run.sh"
