#!/usr/bin/env python3
"""Data pipeline throughput at 0.25 degrees: ERA5Dataset samples/s through a DataLoader.

Writes a synthetic ERA5-layout year at 0.25 degrees (721 x 1440, 13 levels, the default
variables: U V T Q upper air, SP t2m surface, tsi forcing, Z_GDS4_SFC LSM static) into a
temporary folder, as netCDF (one chunk per variable and time step, as ERA5 archives are
chunked) and as zarr stores (the same chunks, consolidated metadata). A real year holds
1460 six-hourly steps (333 GB of float32 here); `--times` writes the first few, since the
cost of a sample does not depend on how many steps a file holds. Values are random
(incompressible; no compression, as the default netCDF writer does).

Then, per format and DataLoader worker count (0, 2, 4; batch 1, a sample = 1 history + 1
target step, the default experiment's shape), through the trainer's loader iterated as the
trainer iterates it (`recycled`: sample buffers reused): samples/s with the page cache
dropped first (cold: disk and decode; only as root) and with the files cached (warm: decode
and copy, the steady state of a long iteration), the bytes read per sample (`rchar` of
/proc/self/io, 0 workers), and the time of one warm `__getitem__` beside the time of
reading the same variables into fresh arrays (`read_raw`: what a sample cost before its
buffers were reused).

Assumed GPU step: 0.4 s per sample. A wxformer of ~200M parameters over the 0.25-degree
grid with 4 x 4 patches sees 721 x 1440 / 16 ~ 65k tokens; forward + backward is about
6 x 2e8 x 6.5e4 ~ 8e13 FLOP, ~0.4 s at 200 TFLOP/s of bf16 (an H100 at a realistic
fraction of peak). One sample must load in well under that per GPU, i.e. a node of 4 GPUs
needs >= 10 samples/s from its loaders.

    python benchmarks/data.py [--times 9] [--samples 8] [--formats netcdf,zarr]
                              [--workers 0,2,4] [--dir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from determinism import report  # noqa: E402
from machine import cpu_name  # noqa: E402  (one home for the machine's name)

from credit.data import ERA5Dataset, VariableSpec, collate_samples, recycled  # noqa: E402

GRID = (721, 1440)
LEVELS = [50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000]
SPEC = VariableSpec(upper_air=("U", "V", "T", "Q"), surface=("SP", "t2m"), forcing=("tsi",),
                    static=("Z_GDS4_SFC", "LSM"))
GPU_STEP_S = 0.4
EXT = {"netcdf": ".nc", "zarr": ".zarr"}


def _write(ds: xr.Dataset, path: Path) -> None:
    encoding = {}
    for name, var in ds.data_vars.items():
        chunks = tuple(1 if d == "time" else n for d, n in zip(var.dims, var.shape))
        encoding[name] = {"chunks": chunks} if path.suffix == ".zarr" else {"chunksizes": chunks}
    if path.suffix == ".zarr":
        ds.to_zarr(path, mode="w", encoding=encoding, zarr_format=2, consolidated=True)
    else:
        ds.to_netcdf(path, engine="netcdf4", encoding=encoding)


def write_year(root: Path, fmt: str, n_times: int) -> None:
    """The year's files in `fmt`, plus unit statistics (the benchmark times reads, not skill)."""
    root.mkdir(parents=True, exist_ok=True)
    ext = EXT[fmt]
    rng = np.random.default_rng(0)
    lat, lon = np.linspace(90, -90, GRID[0]), np.arange(GRID[1]) * 0.25
    times = np.datetime64("2000-01-01T00", "ns") + np.arange(n_times) * np.timedelta64(6, "h")
    coords = {"time": times, "level": ("level", np.asarray(LEVELS, np.int32)), "latitude": lat, "longitude": lon}
    upper = {v: (("time", "level", "latitude", "longitude"),
                 rng.standard_normal((n_times, len(LEVELS), *GRID), np.float32)) for v in SPEC.upper_air}
    surface = {v: (("time", "latitude", "longitude"), rng.standard_normal((n_times, *GRID), np.float32))
               for v in SPEC.surface}
    _write(xr.Dataset({**upper, **surface}, coords=coords), root / f"era5_2000{ext}")
    del upper, surface
    forcing = {"tsi": (("time", "latitude", "longitude"), rng.standard_normal((n_times, *GRID), np.float32))}
    _write(xr.Dataset(forcing, coords={k: v for k, v in coords.items() if k != "level"}),
           root / f"forcing_2000{ext}")
    static = {v: (("latitude", "longitude"), rng.standard_normal(GRID, np.float32)) for v in SPEC.static}
    _write(xr.Dataset(static, coords={"latitude": lat, "longitude": lon}), root / f"static{ext}")
    for name, value in (("mean", 0.0), ("std", 1.0)):
        data = {v: (("level",), np.full(len(LEVELS), value)) for v in SPEC.upper_air}
        data |= {v: ((), value) for v in SPEC.surface + SPEC.forcing + SPEC.static}
        xr.Dataset(data, coords={"level": LEVELS}).to_netcdf(root / f"{name}.nc")


def dataset(root: Path, fmt: str, n_times: int) -> ERA5Dataset:
    ext = EXT[fmt]
    last = np.datetime64("2000-01-01T00") + (n_times - 1) * np.timedelta64(6, "h")
    files = dict(upper_air=f"era5_*{ext}", surface=f"era5_*{ext}", diagnostic=f"era5_*{ext}",
                 forcing=f"forcing_*{ext}", static=f"static{ext}", mean="mean.nc", std="std.nc")
    return ERA5Dataset(root, files=files, variables=SPEC, levels=LEVELS,
                       period=("2000-01-01T00", str(last)), history_len=1, forecast_len=1)


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def rate(ds: ERA5Dataset, workers: int, samples: int, cold: bool) -> float:
    """Samples/s through the trainer's loader, iterated as the trainer does (`recycled`).

    Warm: one iteration over the samples three times, as the trainer's endless loader runs,
    timing the last two passes (the first starts the workers, opens the files and fills the
    buffer pools). Cold: one untimed pass, the page cache dropped, then a second pass timed."""
    order = list(range(samples)) * (1 if cold else 3)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(ds, order), batch_size=1, num_workers=workers,
        persistent_workers=workers > 0, multiprocessing_context="fork" if workers else None,
        collate_fn=collate_samples)  # the trainer's loader
    if cold:
        for _ in recycled(loader):  # workers started, files open, buffers pooled
            pass
        drop_page_cache()
    start = time.perf_counter()
    for n, _ in enumerate(recycled(loader), 1):
        if n == samples and not cold:
            start = time.perf_counter()
    return (len(order) - (0 if cold else samples)) / (time.perf_counter() - start)


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def anatomy(ds: ERA5Dataset, index: int) -> tuple[float, float, int]:
    """(seconds of one warm `__getitem__`, seconds of reading its variables into fresh arrays,
    bytes read)."""
    ds[index]  # warm: files open, pages cached
    before = _rchar()
    start = time.perf_counter()
    ds[index]
    whole = time.perf_counter() - start
    read_bytes = _rchar() - before
    times = ds.times[index].astype(np.int64) + ds.step_ns * np.arange(2)
    start = time.perf_counter()
    for var in SPEC.upper_air + SPEC.surface + SPEC.forcing:
        ds.read_raw(var, times)
    return whole, time.perf_counter() - start, read_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--times", type=int, default=9, help="time steps written (samples = times - 1)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--formats", default="netcdf,zarr")
    parser.add_argument("--workers", default="0,2,4")
    parser.add_argument("--dir", type=Path, help="where to write the data (default: a temporary folder)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.samples > args.times - 1:
        parser.error(f"--samples {args.samples} needs --times >= {args.samples + 1}")
    formats = args.formats.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    base = Path(tempfile.mkdtemp(dir=args.dir))
    cold_ok = drop_page_cache()
    torch.set_num_threads(1)
    lines = [
        "# ERA5Dataset throughput at 0.25 degrees (721 x 1440, 13 levels, default variables)",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
        f"data in {base} ({'page cache dropped for cold runs' if cold_ok else 'cold runs unavailable: not root'}); "
        f"batch 1, {args.samples} samples per pass; assumed GPU step {GPU_STEP_S} s per sample (see the script).",
        "",
        "| format | workers | cold samples/s | warm samples/s | warm ms/sample | vs assumed GPU step |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    try:
        for fmt in formats:
            root = base / fmt
            start = time.perf_counter()
            write_year(root, fmt, args.times)
            written = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
            notes.append(f"{fmt}: wrote {written / 2**30:.2f} GiB in {time.perf_counter() - start:.0f} s")
            ds = dataset(root, fmt, args.times)
            whole, reads, read_bytes = anatomy(ds, 0)
            sample_bytes = sum(t.numel() * t.element_size() for t in ds[0].values())
            notes.append(f"{fmt}: one warm sample {whole * 1e3:.0f} ms (its buffers reused); its "
                         f"variables read into fresh arrays instead (`read_raw`) {reads * 1e3:.0f} ms; "
                         f"{read_bytes / 2**20:.0f} MiB read from files per sample "
                         f"(the sample holds {sample_bytes / 2**20:.0f} MiB)")
            for w in workers:
                cold = rate(ds, w, args.samples, True) if cold_ok else float("nan")
                warm = rate(ds, w, args.samples, False)
                lines.append(f"| {fmt} | {w} | {cold:.2f} | {warm:.2f} | {1e3 / warm:.0f} | "
                             f"{GPU_STEP_S * warm:.1f}x |")
                print(lines[-1], flush=True)
            shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines += ["", *[f"- {n}" for n in notes], "",
              "`vs assumed GPU step` = samples loaded in one assumed GPU step (>= 1: the loader keeps one GPU fed).",
              "", f"Reproduce: `python benchmarks/data.py --times {args.times} --samples {args.samples}`"]
    report(lines, args.out)


if __name__ == "__main__":
    main()
