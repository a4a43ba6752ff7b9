"""CREDIT's bridgescaler files: the scalers `credit preprocess` fits and its gen2
`bridgescaler_transform` pre- and postblocks apply, read with NCAR's `bridgescaler` package.

A file nests one fitted scaler per variable as {data type: {source: {var key: scaler}}}: the data
types `input` and `target` are fitted on different samples, so a variable's input and target
statistics differ; a var key is `SOURCE/FIELD_TYPE/3d|2d/NAME`. The z-score scaler
(`DStandardScalerTensor`, channels first: one mean and variance per level of a 3-D variable, one
for a 2-D one, or one per grid point for a 2-D variable the blocks name in `spatial_variables`)
is read here; CREDIT's transform is `(x - mean) / sqrt(var)` and its inverse `x * sqrt(var) +
mean`, in float32 with torch's sqrt. Quantile and min-max scalers and channels-last ones are
refused by name.

Files are written with bridgescaler (`write_standard_scalers`) but read by `read_scaler_file`
here, which decodes bridgescaler's JSON encoding itself (a scaler per leaf, as a JSON string of
its attributes; arrays as base64 bytes with numpy's dtype description). Hand-written because
importing bridgescaler compiles the numba kernels of its quantile scalers, about 14 s of CPU
in every process on the 2-core Zen 3 VM (`python -c "import bridgescaler"`), so every rank of a run paid it before its first step; the tests check the
two readers agree on every attribute a standard scaler has.
"""

from __future__ import annotations

import json
import os
from base64 import b64decode
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from credit.data.catalog import DataError

FIELD_KEYS = {"upper_air": ("prognostic", "3d"), "surface": ("prognostic", "2d"),
              "dynamic_forcing": ("dynamic_forcing", "2d"), "static": ("static", "2d"),
              "diagnostic": ("diagnostic", "2d")}
"""This project's variable roles as CREDIT's gen2 var keys spell them (field type, dims)."""


def var_key(source: str, role: str, name: str) -> str:
    field_type, dims = FIELD_KEYS[role]
    return f"{source}/{field_type}/{dims}/{name}"


SIDE_ROLES = {"input": ("upper_air", "surface", "dynamic_forcing", "static"),
              "target": ("upper_air", "surface", "diagnostic")}
"""The variable roles of each side of a sample, as CREDIT's batch holds them."""


def data_statistics(path: Path, side: str, names: Mapping[str, Sequence[str]], source: str,
                    scaled: Sequence[str] | None, levels: int, spatial: Sequence[str] = (),
                    grid: tuple[int, int] | None = None,
                    forcing_sources: Mapping[str, str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """({variable: mean}, {variable: std}) of `side` for the `scaled` variables of `names` (role ->
    bare names; None: every variable the file scales), shaped as a field takes them (a level
    profile (levels, 1, 1) for upper-air variables, a number otherwise, the (lat, lon) `grid` for
    the `spatial` ones, whose scaler holds one statistic per grid point in row-major order, as
    CREDIT flattens a (batch, 1, 1, lat, lon) tensor); a variable the file does not scale is
    absent (CREDIT's preblock passes it through as stored). `forcing_sources` names the source of
    a dynamic forcing variable another source gives (a `tisr` source's)."""
    scalers = read_standard_scalers(path, side)
    wanted = None if scaled is None else set(scaled)
    known = {v for role_names in names.values() for v in role_names}
    if wanted is not None and wanted - known:
        raise DataError(f"the bridgescaler's variables {sorted(wanted - known)} are not among the data's "
                        f"variables {sorted(known)}")
    means, stds = {}, {}
    for role in SIDE_ROLES[side]:
        for var in names[role]:
            key = var_key((forcing_sources or {}).get(var, source) if role == "dynamic_forcing" else source, role, var)
            if wanted is not None and var not in wanted:
                continue
            if key not in scalers:
                if wanted is not None:
                    raise DataError(f"{path} has no {side} scaler for {key} (its {side} scalers: {sorted(scalers)})")
                continue
            mean, std = scalers[key]
            if var in spatial:
                if role == "upper_air" or grid is None:
                    raise DataError(f"{key} is scaled per grid point; only 2-D variables can be (CREDIT flattens "
                                    "a single-level, single-time tensor)")
                if mean.size != grid[0] * grid[1]:
                    raise DataError(f"{path}: the {side} scaler of {key} holds {mean.size} values; scaled per grid "
                                    f"point (spatial_variables) on the data's {grid[0]}x{grid[1]} grid it needs "
                                    f"{grid[0] * grid[1]} (one per latitude-longitude point)")
                means[var], stds[var] = mean.reshape(grid), std.reshape(grid)
                continue
            channels = levels if role == "upper_air" else 1
            if mean.size != channels:
                gridded = grid is not None and role != "upper_air" and mean.size == grid[0] * grid[1]
                raise DataError(f"{path}: the {side} scaler of {key} holds {mean.size} channels; the data give {var} "
                                f"{channels}, matched by position as CREDIT's scaler matches them"
                                + ("; one per grid point: the blocks' spatial_variables name the variables so "
                                   "fitted" if gridded else ""))
            shape = (-1, 1, 1) if role == "upper_air" else ()
            means[var], stds[var] = mean.reshape(shape), std.reshape(shape)
    return means, stds


def read_standard_scalers(path: str | Path, data_type: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{var key: (mean, std)} of the file's `data_type` ("input" or "target") scalers, float32 per
    channel, std = sqrt(var) as CREDIT's transform takes it; a `DataError` naming the file and
    variable for a missing file, another scaler kind, or a variance that is not finite and > 0."""
    path = Path(os.path.expandvars(str(path)))
    if not path.is_file():
        raise DataError(f"bridgescaler file {path} does not exist (CREDIT's `credit preprocess` fits and writes it)")
    try:
        scalers = read_scaler_file(path)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise DataError(f"bridgescaler file {path} is not a scaler file bridgescaler reads: "
                        f"{type(err).__name__}: {err}") from None
    if data_type not in scalers:
        raise DataError(f"bridgescaler file {path} has no {data_type!r} scalers; it holds {sorted(scalers)}")
    out = {}
    for source in dict(scalers[data_type]).values():
        for key, scaler in dict(source).items():
            kind = scaler.get("type")
            if kind != "DStandardScalerTensor":
                raise DataError(f"{path}: {data_type} scaler of {key} is a {kind}; the z-score scaler "
                                "(DStandardScalerTensor, CREDIT's default scaler_type: standard) is read here")
            if scaler.get("channels_last", False):
                raise DataError(f"{path}: {data_type} scaler of {key} was fitted channels-last (one statistic per "
                                "longitude of CREDIT's (level, time, lat, lon) tensors); CREDIT's tensors are "
                                "channels-first (scaler_params.channels_last: false)")
            mean = np.asarray(scaler["mean_x_"], dtype=np.float32).reshape(-1)
            var = np.asarray(scaler["var_x_"], dtype=np.float32).reshape(-1)
            bad = np.flatnonzero(~np.isfinite(var) | (var <= 0) | ~np.isfinite(mean))
            if bad.size:
                raise DataError(f"{path}: {data_type} scaler of {key} has variance {float(var[bad[0]])} and mean "
                                f"{float(mean[bad[0]])} at channel {int(bad[0])}; CREDIT divides by sqrt(var), so "
                                "each must be finite and the variance > 0 (a constant field?)")
            # torch's sqrt, as CREDIT's transform takes it: its vector kernels are not always correctly
            # rounded (1 ulp off on AVX2), so numpy's would differ from CREDIT's in the last bit
            out[key] = (mean, torch.sqrt(torch.from_numpy(var)).numpy())
    return out


def scaler_variance(path: str | Path, data_type: str, key: str) -> float:
    """The variance CREDIT's BaseLoss weighs `key` by: the mean over channels (float32, torch)
    of its `data_type` z-score scaler's variance in the file; NaN where the file has no such
    scaler or a variance that is not finite (BaseLoss then keeps the variable's manual weight)."""
    for source in read_scaler_file(path).get(data_type, {}).values():
        scaler = dict(source).get(key)
        if scaler is None:
            continue
        if scaler.get("type") != "DStandardScalerTensor":
            raise DataError(f"{path}: {data_type} scaler of {key} is a {scaler.get('type')}; the z-score scaler "
                            "(DStandardScalerTensor) is read here")
        variance = torch.as_tensor(np.asarray(scaler["var_x_"], dtype=np.float32)).flatten()
        return float(variance.mean()) if bool(torch.isfinite(variance).all()) else float("nan")
    return float("nan")


def _decoded(fields: dict[str, Any]) -> Any:
    """A JSON object of a scaler's attributes, with bridgescaler's encoded numpy values decoded
    (a base64 buffer, its dtype description and shape; a shape of () is one number)."""
    if "__numpy__" in fields:
        values = np.frombuffer(b64decode(fields["__numpy__"]), np.lib.format.descr_to_dtype(fields["dtype"])).copy()
        return values.reshape(fields["shape"]) if fields["shape"] else values[0]
    if fields.get("object") == "ndarray":
        return np.array(fields["data"], dtype=fields["dtype"]).reshape(fields["shape"])
    return fields


def read_scaler_file(path: str | Path) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """{data type: {source: {var key: the scaler's attributes}}} of a bridgescaler file, as
    bridgescaler's `load_scaler_dict` nests it; each scaler a dict of what `read_scaler` would set
    on it (`type` its class name, arrays as numpy arrays). JSON errors, and a leaf that is not a
    scaler, raise ValueError, TypeError or KeyError."""
    with open(path) as f:
        nested = json.load(f)

    def leaves(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: leaves(value) for key, value in node.items()}
        if not isinstance(node, str):
            raise TypeError(f"a leaf of type {type(node).__name__}, not a scaler's JSON string")
        scaler = json.loads(node, object_hook=_decoded)
        if not isinstance(scaler, dict) or "type" not in scaler:
            raise KeyError("a leaf without the scaler's 'type'")
        return scaler

    return leaves(nested)


def write_standard_scalers(path: str | Path, scalers: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]) -> None:
    """Write a bridgescaler file as `credit preprocess` leaves it: `scalers` maps a data type
    ("input", "target") to {var key: (mean, std) per channel}; each becomes a fitted channels-first
    `DStandardScalerTensor` (variance std^2) under the var key's source."""
    from bridgescaler import save_scaler_dict
    from bridgescaler.distributed_tensor import DStandardScalerTensor

    nested: dict[str, dict[str, dict[str, object]]] = {}
    for data_type, table in scalers.items():
        for key, (mean, std) in table.items():
            scaler = DStandardScalerTensor(channels_last=False)
            scaler.mean_x_ = torch.as_tensor(np.asarray(mean, dtype=np.float32).reshape(-1))
            scaler.var_x_ = torch.as_tensor(np.asarray(std, dtype=np.float32).reshape(-1)) ** 2
            scaler.n_ = torch.ones_like(scaler.mean_x_)
            scaler.x_columns_ = list(range(scaler.mean_x_.numel()))
            scaler._fit = True
            nested.setdefault(data_type, {}).setdefault(key.split("/")[0], {})[key] = scaler
    save_scaler_dict(nested, str(path))
