"""Reading variables' values from the files the catalog found: one process's open files, and
the direct read of plain netCDF-4 variables (and plain zarr v2 arrays) into a buffer.

Handles open lazily, once per file and process, and are reopened after a fork (a DataLoader
worker never uses its parent's). ``open_count`` counts the files opened.

Direct reads are hand-written below xarray because xarray has no ``out=``: every read would
return a fresh array that the sample then copies, which at 0.25 degrees is a second pass over
~0.4 GiB per sample (benchmarks/data.py). A variable of a netCDF-4 (HDF5) file is read by
h5py straight into the caller's buffer when xarray would hand back the stored values
unchanged: float32, no ``scale_factor``/``add_offset``/``missing_value``, ``_FillValue``
absent or NaN, and dims already in the sample's order; a plain zarr v2 array's chunks are
decoded straight into it (`zarr_direct.py`). Anything else (packed integers, fill values,
transposed dims, netCDF-3, zarr v3) goes through xarray, which decodes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import h5py
import numpy as np
import xarray as xr

from .catalog import TIME_NAME, FileInfo, is_hdf5_file, is_zarr_store, open_store
from .integrity import NonFiniteData, nonfinite_problem
from .zarr_direct import ZarrChunks

__all__ = ["OpenFiles", "VariableReader", "plain_float32"]

_DECODED_ATTRS = ("scale_factor", "add_offset", "missing_value")


def plain_float32(var: h5py.Dataset) -> bool:
    """Whether xarray would return `var`'s stored values unchanged as float32."""
    if var.dtype != np.dtype("=f4") or any(a in var.attrs for a in _DECODED_ATTRS):
        return False
    fill = var.attrs.get("_FillValue")
    return fill is None or bool(np.all(np.isnan(np.asarray(fill, np.float64))))


class OpenFiles:
    """The xarray and h5py handles this process holds, by path."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self.open_count = 0
        self._reset()

    def _reset(self) -> None:
        self._xarray: dict[Path, xr.Dataset] = {}
        self._h5: dict[Path, h5py.File | None] = {}
        self._direct: dict[tuple[Path, str], h5py.Dataset | ZarrChunks | None] = {}
        self._opened: set[Path] = set()

    def _own(self) -> None:
        if self._pid != os.getpid():  # inherited handles belong to the parent
            self._reset()
            self._pid = os.getpid()

    def _count(self, path: Path) -> None:
        if path not in self._opened:
            self._opened.add(path)
            self.open_count += 1

    def xarray(self, path: Path) -> xr.Dataset:
        """The open xarray dataset of `path` (decoded reads of any variable)."""
        self._own()
        ds = self._xarray.get(path)
        if ds is None:
            ds = self._xarray[path] = open_store(path, cache=False, bulk_reads=True)
            self._count(path)
        return ds

    def direct(self, path: Path, var: str, dims: tuple[str, ...],
               want: tuple[str, ...]) -> h5py.Dataset | ZarrChunks | None:
        """A reader of `var` of `path` straight into a float32 buffer laid out as `want` (`dims`:
        its dims in the file): h5py's dataset for netCDF-4, `ZarrChunks` for a plain zarr v2
        array; None when it must go through xarray."""
        self._own()
        key = (path, var)
        if key not in self._direct:
            found = None
            if dims == want and is_hdf5_file(path):
                if path not in self._h5:
                    self._h5[path] = h5py.File(path, "r")
                    self._count(path)
                candidate = self._h5[path].get(var)
                if isinstance(candidate, h5py.Dataset) and plain_float32(candidate):
                    found = candidate
            elif dims == want and is_zarr_store(path):
                found = ZarrChunks.open(path, var, want)
                if found is not None:
                    self._count(path)
            self._direct[key] = found
        return self._direct[key]

    def close(self) -> None:
        """Close this process's handles (they reopen on the next read)."""
        if self._pid == os.getpid():
            for ds in self._xarray.values():
                ds.close()
            for f in self._h5.values():
                if f is not None:
                    f.close()
        self._reset()

    def __getstate__(self) -> dict:
        return {"_pid": None, "open_count": 0}  # handles never travel to another process

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()


class VariableReader:
    """Values of variables at given times, from the catalog's index: ``where[var]`` is (sorted
    times, files, file of each time, index in that file), ``level_idx[(var, path)]`` the level
    indices in that file in the order of ``levels``. Every read is checked finite
    (:class:`NonFiniteData` names the file, variable, time and level)."""

    def __init__(self, where: Mapping[str, tuple[np.ndarray, list[FileInfo], np.ndarray, np.ndarray]],
                 level_idx: Mapping[tuple[str, Path], list[int]], levels: Sequence[float], level_dim: str) -> None:
        self._where, self._level_idx, self._levels, self._level_dim = where, level_idx, tuple(levels), level_dim
        self.files = OpenFiles()

    def read(self, var: str, times: np.ndarray, upper: bool) -> np.ndarray:
        """Values of ``var`` at ``times`` (all present): (T, L, H, W) for upper-air, else (T, H, W)."""
        t_all, infos, fidx, lidx = self._where[var]
        pos = np.searchsorted(t_all, times)
        out = [self._read_file(var, infos[k], lidx[pos[fidx[pos] == k]], times[fidx[pos] == k], upper)
               for k in dict.fromkeys(fidx[pos])]  # files in time order
        arr = out[0] if len(out) == 1 else np.concatenate(out)
        return arr.astype(np.float32, copy=False)

    def _read_file(self, var: str, info: FileInfo, local: np.ndarray, times: np.ndarray, upper: bool) -> np.ndarray:
        """Values of ``var`` at indices ``local`` of ``info``'s time axis, through xarray."""
        da = self.files.xarray(info.path)[var]
        tsel = slice(int(local[0]), int(local[-1]) + 1) if np.all(np.diff(local) == 1) else local
        sel = {TIME_NAME: tsel}
        if upper:
            li = self._level_idx[(var, info.path)]
            uniq = sorted(set(li))  # read increasing indices, then reorder to the requested order
            # a slice reads the levels as one contiguous block (a list indexes them one by one)
            contiguous = uniq == list(range(uniq[0], uniq[-1] + 1))
            sel[self._level_dim] = slice(uniq[0], uniq[-1] + 1) if contiguous else uniq
            arr = da.isel(sel).transpose(TIME_NAME, self._level_dim, info.lat_name, info.lon_name).values
            if li != uniq:
                arr = arr[:, [uniq.index(i) for i in li]]
        else:
            arr = da.isel(sel).transpose(TIME_NAME, info.lat_name, info.lon_name).values
        problem = nonfinite_problem(arr, var, info, times, self._levels if upper else None)
        if problem:
            raise NonFiniteData(problem)
        return arr

    def read_into(self, var: str, times: np.ndarray, upper: bool, dests: Sequence[np.ndarray]) -> None:
        """Values of ``var`` at each of ``times`` into ``dests`` (one C-contiguous float32
        ``(levels, H, W)`` or ``(1, H, W)`` buffer per time): plain netCDF-4 variables straight
        from h5py, plain zarr v2 chunks decoded straight in, the rest through xarray and one
        copy."""
        t_all, infos, fidx, lidx = self._where[var]
        pos = np.searchsorted(t_all, times)
        levels = self._levels if upper else None
        through_xarray = []
        for k, (t, p, dest) in enumerate(zip(times, pos, dests)):
            info, local = infos[fidx[p]], int(lidx[p])
            want = ((TIME_NAME, self._level_dim) if upper else (TIME_NAME,)) + (info.lat_name, info.lon_name)
            source = self.files.direct(info.path, var, info.dims[var], want)
            if source is None or (isinstance(source, ZarrChunks) and not source.has_chunk(local)):
                through_xarray.append(k)
                continue
            if upper:
                li = self._level_idx[(var, info.path)]
                if li == list(range(li[0], li[0] + len(li))):  # one contiguous block of levels
                    source.read_direct(dest, np.s_[local, li[0]:li[-1] + 1])
                else:
                    for j, level in enumerate(li):
                        source.read_direct(dest[j], np.s_[local, level])
            else:
                source.read_direct(dest[0], np.s_[local])
            problem = nonfinite_problem(dest[None], var, info, np.array([t]), levels)
            if problem:
                raise NonFiniteData(problem)
        if through_xarray:  # one read per file for all its times (zarr: one call, not one per chunk)
            values = self.read(var, times[through_xarray], upper)
            for k, value in zip(through_xarray, values):
                dests[k][...] = value

    def read_static(self, var: str, info: FileInfo) -> np.ndarray:
        """Float32 (H, W) values of static ``var`` of ``info`` (its first time if it has a time axis)."""
        da = self.files.xarray(info.path)[var]
        if TIME_NAME in da.dims:
            da = da.isel({TIME_NAME: 0})
        values = da.transpose(info.lat_name, info.lon_name).values.astype(np.float32)
        problem = nonfinite_problem(values[None], var, info, None, None)
        if problem:
            raise NonFiniteData(problem)
        return values
