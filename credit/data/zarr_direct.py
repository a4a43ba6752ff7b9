"""Direct reads of plain zarr v2 arrays: a time step's chunk decoded straight into the sample.

xarray's zarr engine goes through zarr-python's asynchronous codec pipeline, which took
~100 ms for a 51 MB blosc chunk that numcodecs alone decodes into a given buffer in
~10-15 ms (2-core EPYC VM), and it returns a fresh array that the sample then copies;
zarr's own ``out=`` runs the same pipeline. So, for the layout that xarray would return
unchanged, the chunk file is read here and decoded by numcodecs (zarr v2's codec library)
into the caller's buffer. That layout: zarr v2 on a local directory store, little-endian
float32, C order, no filters, ``fill_value`` NaN or null, no ``scale_factor``/``add_offset``/
``missing_value``/``_FillValue`` attribute, dims (``_ARRAY_DIMENSIONS``) already in the
sample's order, "." as the chunk key separator, and one chunk per time step spanning every
other dim (how ERA5 archives and
``credit data generate --format zarr`` chunk). Anything else, and a time whose chunk file is
absent (zarr's fill value), goes through xarray. Hand-written: zarr-python offers no read
into a caller's buffer that skips its pipeline's copies.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from .catalog import DataError

__all__ = ["ZarrChunks"]

_DECODED_ATTRS = ("scale_factor", "add_offset", "missing_value", "_FillValue")


class ZarrChunks:
    """One plain zarr v2 variable, read a time step's chunk at a time (see the module)."""

    _raw = np.empty(0, np.uint8)  # this process's compressed-chunk buffer, reused by every read

    def __init__(self, folder: Path, shape: tuple[int, ...], codec: numcodecs.abc.Codec | None) -> None:
        self.folder, self.shape, self.codec = folder, shape, codec
        self._scratch: np.ndarray | None = None  # one chunk, for reads of part of a chunk

    @classmethod
    def open(cls, store: Path, var: str, want: tuple[str, ...]) -> ZarrChunks | None:
        """The direct reader of ``var`` in the zarr store ``store`` laid out as ``want``, or
        None when that variable must go through xarray."""
        folder = store / var
        try:
            meta = json.loads((folder / ".zarray").read_text())
            attrs_file = folder / ".zattrs"
            attrs = json.loads(attrs_file.read_text()) if attrs_file.exists() else {}
        except (OSError, ValueError):  # zarr v3, or not a plain array folder
            return None
        shape, chunks = tuple(meta.get("shape", ())), tuple(meta.get("chunks", ()))
        plain = (meta.get("zarr_format") == 2 and meta.get("dtype") == "<f4" and meta.get("order") == "C"
                 and not meta.get("filters") and meta.get("fill_value") in (None, "NaN")
                 and not any(a in attrs for a in _DECODED_ATTRS)
                 and tuple(attrs.get("_ARRAY_DIMENSIONS", ())) == want
                 and len(shape) == len(want) and chunks == (1, *shape[1:])
                 and meta.get("dimension_separator", ".") in (".", None))
        if not plain:
            return None
        compressor = meta.get("compressor")
        import numcodecs  # here, not at import: only zarr data needs it (and the GPU kit carries no zarr stack)

        try:
            codec = numcodecs.get_codec(dict(compressor)) if compressor else None
        except (ValueError, TypeError, KeyError):  # a codec numcodecs does not know
            return None
        return cls(folder, shape, codec)

    def _chunk_path(self, t: int) -> Path:
        return self.folder / ".".join([str(t)] + ["0"] * (len(self.shape) - 1))

    def has_chunk(self, t: int) -> bool:
        """Whether time step ``t`` is stored (an absent chunk reads as the fill value)."""
        return self._chunk_path(t).is_file()

    def _decode(self, t: int, out: np.ndarray) -> None:
        """Time step ``t``'s whole chunk into the C-contiguous float32 ``out``."""
        path, flat = self._chunk_path(t), out.reshape(-1)
        nbytes = math.prod(self.shape[1:]) * 4
        if flat.nbytes != nbytes or not out.flags.c_contiguous:  # a caller's bug, not the data's
            raise ValueError(f"{path}: a {nbytes}-byte C-contiguous buffer is needed")
        if self.codec is None:  # stored raw: straight from the file into the buffer
            with open(path, "rb") as handle:
                got = handle.readinto(memoryview(flat).cast("B"))
            if got != nbytes:
                raise DataError(f"damaged zarr chunk {path} (variable {self.folder.name!r}, time index {t}): "
                                f"holds {got} bytes, an uncompressed chunk has {nbytes}")
            return
        with open(path, "rb") as handle:  # into a reused buffer: fresh bytes cost their page faults
            size = os.fstat(handle.fileno()).st_size
            if ZarrChunks._raw.nbytes < size:
                ZarrChunks._raw = np.empty(size, np.uint8)
            got = handle.readinto(memoryview(ZarrChunks._raw)[:size])
        if got != size:
            raise DataError(f"zarr chunk {path} changed while read: {got} of {size} bytes")
        try:
            self.codec.decode(memoryview(ZarrChunks._raw)[:size], out=flat)
        except Exception as err:  # numcodecs raises RuntimeError/ValueError by codec
            raise DataError(f"damaged zarr chunk {path} (variable {self.folder.name!r}, time index {t}): "
                            f"{self.codec.codec_id} cannot decode its {size} bytes ({err})") from err

    def read_direct(self, dest: np.ndarray, selection: int | tuple) -> None:
        """``dest[...] = var[selection]`` for ``selection`` = time or (time, level index or
        slice), as h5py's ``Dataset.read_direct`` (the reader's calls)."""
        selection = selection if isinstance(selection, tuple) else (selection,)
        t, rest = int(selection[0]), tuple(selection[1:])
        whole = not rest or (len(rest) == 1 and rest[0] == slice(0, self.shape[1]))
        if whole and dest.flags.c_contiguous:
            self._decode(t, dest)
            return
        if self._scratch is None:
            self._scratch = np.empty(self.shape[1:], np.float32)
        self._decode(t, self._scratch)
        dest[...] = self._scratch[rest]
