"""Constants shared by the data-layer tests (a uniquely named module, importable next to them)."""

from credit.data import VariableSpec

GRID = (8, 16)
LEVELS = (500, 850)
FILES = dict(upper_air="era5_*.nc", surface="era5_*.nc", forcing="forcing_*.nc", static="static.nc",
             diagnostic="era5_*.nc", mean="mean.nc", std="std.nc")
# the generator's zarr layout: data stores, netCDF statistics
ZARR_FILES = dict(upper_air="era5_*.zarr", surface="era5_*.zarr", forcing="forcing_*.zarr",
                  static="static.zarr", diagnostic="era5_*.zarr", mean="mean.nc", std="std.nc")
# either format, and the two mixed in one dataset
ANY_FILES = dict(upper_air="era5_*", surface="era5_*", forcing="forcing_*", static="static.*",
                 diagnostic="era5_*", mean="mean.nc", std="std.nc")


def files_for(root) -> dict:
    """The file globs of a generated dataset in `root`, netCDF or zarr."""
    return ZARR_FILES if (root / "static.zarr").exists() else FILES
SPEC = VariableSpec(upper_air=("U", "V", "T", "Q"), surface=("SP",), forcing=("tsi",),
                    static=("Z_GDS4_SFC", "LSM"), diagnostic=("t2m",))
