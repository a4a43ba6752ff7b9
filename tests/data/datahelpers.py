"""Constants shared by the data-layer tests (a uniquely named module, importable next to them)."""

from credit.data import VariableSpec

GRID = (8, 16)
LEVELS = (500, 850)
FILES = dict(upper_air="era5_*.nc", surface="era5_*.nc", forcing="forcing_*.nc", static="static.nc",
             diagnostic="era5_*.nc", mean="mean.nc", std="std.nc")
SPEC = VariableSpec(upper_air=("U", "V", "T", "Q"), surface=("SP",), forcing=("tsi",),
                    static=("Z_GDS4_SFC", "LSM"), diagnostic=("t2m",))
