"""CREDIT's gen2 `tisr` source (credit/interop/tisr.py) against CREDIT's own TISRDataset and
MultiSourceDataset (tests/fixtures/credit_tisr, made by its make.py with CREDIT's code and a
synthetic solar irradiance table): the field at a time, and the samples of a gen2 file whose
second source computes it, through CREDIT's era5_normalizer or bridgescaler preblock.

Tolerance of the computed field: bitwise on the CPU that made the fixture (the same torch float32
operations in CREDIT's order). On another CPU path (torch's scalar kernels, MKL's reproducible
path) the orbit's angles, float32 sums near 75 rad, may round 1 ulp (2^-17 rad) apart, and so
may the sines and cosines of them: cos(zenith) moves by up to about 2^-17, the irradiance by 1361
W m-2 times that, and the integral by that times the window's seconds where every trapezoid moves
the same way: `atol` = 1361 x 2^-17 x period (224 J m-2 over 6 h, 2e-5 of the fields' 1e7);
`rtol` 4e-7 for the factors' own ulp. The scalar path measured 22 J m-2 over 3 h in 7 steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from credit.config import compose_config
from credit.data.catalog import DataError
from credit.data.from_config import build_dataset
from credit.interop import tisr
from credit.interop.config_file import map_credit_file
from credit.models.inputs import credit_input

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "credit_tisr"
DATA = FIXTURES / "credit_gen2_data" / "data"
GRIDS = {"global": ([90, -90, 9], [0, 337.5, 16]), "regional": ([50, 20, 4], [-130, -60, 8])}
RTOL = 4e-7


def atol(period: str) -> float:
    return 1361 * 2 ** -17 * pd.Timedelta(period).total_seconds()


ATOL = atol("6h")  # the samples' time step


@pytest.fixture(scope="module")
def expected() -> dict:
    return torch.load(FIXTURE / "expected.pt")


def _solar() -> dict:
    return json.loads((FIXTURE / "meta.json").read_text())["solar_source"]


def credit_config(scaler: bool = False) -> dict:
    """The fixture's gen2 file: the data fixture's variant A with the tisr source SOLAR after
    ERA5, normalised by the era5_normalizer, or by the bridgescaler file `make.py` fitted."""
    base = torch.load(FIXTURES / "credit_gen2_data" / "expected_A.pt")["config"]
    conf = json.loads(json.dumps(base).replace("DATA/", f"{DATA}/"))
    conf["data"]["source"]["SOLAR"] = _solar()
    conf["validation_data"]["source"] = conf["data"]["source"]
    if scaler:
        variables = json.loads((FIXTURE / "meta.json").read_text())["scaled_variables"]
        conf["preblocks"] = {"per_step": {
            "scaler": {"type": "bridgescaler_transform",
                       "args": {"scaler_path": str(FIXTURE / "scaler.json"), "variables": variables,
                                "method": "transform", "scaler_params": {"channels_last": False}}},
            "concat": {"type": "concat", "args": {"to_device": False}}}}
    return conf


def _train(conf: dict, *extra: str):
    mapping = map_credit_file(conf)
    assert mapping.refused == []
    cfg = compose_config([*mapping.overrides, f"data.credit.tisr.tsi_table={FIXTURE / 'tsi_table.nc'}", *extra])
    return cfg, build_dataset(cfg.data, "train_period")


@pytest.mark.parametrize("key", [f"{when} {period} {steps} {grid}" for when, period, steps in
                                 json.loads((FIXTURE / "meta.json").read_text())["times"] for grid in GRIDS])
def test_the_field_at_a_time_is_credits(expected, key):
    when, period, steps, grid = key.split()
    lat, lon = tisr.grid_from_specs(*GRIDS[grid], "test")
    times, values = tisr.read_tsi_table(FIXTURE / "tsi_table.nc")
    ours = tisr.integrated(pd.Timestamp(when), pd.Timedelta(period), int(steps), lat, lon, times, values)
    torch.testing.assert_close(ours, expected["computed"][key], atol=atol(period), rtol=RTOL)
    assert expected["computed"][key].max() > 1e6 and expected["computed"][key].min() >= 0  # day and night


def test_the_grid_integrates_in_blocks_of_rows(expected, monkeypatch):
    """A grid larger than `_BLOCK_ELEMENTS` goes in blocks of rows, each integrated over all
    its times: every point's float32 sum of 2161 trapezoids, perhaps grouped otherwise by
    torch's reduction for the block's shape: within a few ulp (a pairwise sum's error bound,
    log2(2161) x 2^-24 < 1e-6, relative)."""
    lat, lon = tisr.grid_from_specs(*GRIDS["global"], "test")
    times, values = tisr.read_tsi_table(FIXTURE / "tsi_table.nc")
    args = (pd.Timestamp("2000-12-31T18:00"), pd.Timedelta("6h"), 2160, lat, lon, times, values)
    whole = tisr.integrated(*args)
    monkeypatch.setattr(tisr, "_BLOCK_ELEMENTS", 1)  # the fewest rows a block
    torch.testing.assert_close(tisr.integrated(*args), whole, rtol=1e-6, atol=0)
    torch.testing.assert_close(whole, expected["computed"]["2000-12-31T18:00 6h 2160 global"], atol=ATOL, rtol=RTOL)


def test_a_grid_file_of_two_dimensional_coordinates(expected, tmp_path):
    """`latlon_grid_path` may hold 2-D latitude and longitude under WRF's names (a curvilinear
    grid), read as CREDIT reads them; each point's field depends on its own coordinates only, so
    a grid whose rows are shifted in longitude gives, row by row, the rectangular grids' fields."""
    import xarray as xr

    lat, lon = tisr.grid_from_specs(*GRIDS["regional"], "test")
    xr.Dataset({"XLAT": (("y", "x"), lat.numpy()), "XLONG": (("y", "x"), lon.numpy())}).to_netcdf(tmp_path / "g.nc")
    lat2, lon2 = tisr.grid_from_file(tmp_path / "g.nc")
    assert torch.equal(lat2, lat) and torch.equal(lon2, lon)
    times, values = tisr.read_tsi_table(FIXTURE / "tsi_table.nc")
    call = (pd.Timestamp("2001-01-01T00:00"), pd.Timedelta("6h"), 2160)
    ours = tisr.integrated(*call, lat2, lon2, times, values)
    torch.testing.assert_close(ours, expected["computed"]["2001-01-01T00:00 6h 2160 regional"], atol=ATOL, rtol=RTOL)
    shifted = lon + 7.5 * torch.arange(lat.shape[0], dtype=torch.float32)[:, None]  # not rectangular
    curvilinear = tisr.integrated(*call, lat, shifted, times, values)
    for row in range(lat.shape[0]):
        alone = tisr.integrated(*call, lat[row:row + 1], shifted[row:row + 1], times, values)
        torch.testing.assert_close(curvilinear[row:row + 1], alone, rtol=1e-6, atol=0)


def test_the_samples_of_a_file_with_a_tisr_source_are_credits(expected):
    """The tisr channel comes after ERA5's static and forcing channels (CREDIT's concat: source
    by source); with no statistics for it the era5_normalizer passes it in J m-2, as CREDIT does."""
    _, train = _train(credit_config())
    assert train.forcing_channel_names == ["Z_GDS4_SFC", "LSM", "tsi", "tisr"]
    assert len(train) == len(expected["x_normalised"]) == 15
    for index in range(len(train)):
        sample = train[index]
        model_input = credit_input(sample["state"][None], sample["forcing"][None, :1], sample["static"][None])
        torch.testing.assert_close(model_input[:, :-1], expected["x_normalised"][index][None, :-1], rtol=0, atol=0)
        torch.testing.assert_close(model_input[:, -1:], expected["x_normalised"][index][None, -1:], atol=ATOL,
                                   rtol=RTOL)
    assert expected["x_normalised"][:, -1].max() > 1e6  # as computed, not normalised


def test_the_bridgescaler_preblock_scales_tisr_with_its_own_sources_scaler(expected):
    """The scaler file holds `SOLAR/dynamic_forcing/2d/tisr`, selected by its partial path: the
    normalised field is (x - mean) / sqrt(var), so its tolerance is the field's over the std."""
    cfg, train = _train(credit_config(scaler=True))
    assert "tisr" in cfg.data.credit.scaled_variables
    std = float(train._std["tisr"])
    for index in range(len(train)):
        sample = train[index]
        model_input = credit_input(sample["state"][None], sample["forcing"][None, :1], sample["static"][None])
        torch.testing.assert_close(model_input[:, :-1], expected["x_scaled"][index][None, :-1], rtol=2 ** -22, atol=0)
        torch.testing.assert_close(model_input[:, -1:], expected["x_scaled"][index][None, -1:],
                                   atol=ATOL / std + 1e-6, rtol=RTOL)
    assert expected["x_scaled"][:, -1].abs().max() < 10  # scaled


def test_every_frame_of_a_sample_carries_its_times_tisr():
    """Input and target frames alike (a forecast takes each lead's forcing from them)."""
    _, train = _train(credit_config())
    index = 3
    inputs, targets = train.sample_times(index)
    forcing = train[index]["forcing"]
    for frame, t in enumerate([*inputs, *targets]):
        field = train.solar(int(t))
        assert torch.equal(forcing[frame, -1], torch.from_numpy(field))


@pytest.mark.parametrize("change, line", [
    (lambda s: s.update(lat_spec=[90, -90, 10]), "computes tisr on a 10x16 grid (lat_spec x lon_spec, or its grid "
                                                 "file); the data's grid is 9x16"),
])
def test_a_tisr_grid_other_than_the_datas_is_one_error(change, line):
    conf = credit_config()
    change(conf["data"]["source"]["SOLAR"])
    with pytest.raises(DataError, match=line.replace("(", r"\(").replace(")", r"\)")):
        _train(conf)


@pytest.mark.parametrize("change, line", [
    (lambda c: c["data"].update(source={"SOLAR": c["data"]["source"]["SOLAR"], "ERA5": c["data"]["source"]["ERA5"]}),
     "data.source.SOLAR: a tisr source listed before the files' source"),
    (lambda c: c["data"]["source"].update(SOLAR2=dict(c["data"]["source"]["SOLAR"])),
     "data.source: 3 sources (ERA5, SOLAR, SOLAR2); one ERA5 source is read here, with at most one tisr source"),
    (lambda c: c["data"]["source"]["SOLAR"]["variables"]["dynamic_forcing"].update(vars_2D=["tisr", "x"]),
     "data.source.SOLAR.variables: ['tisr', 'x']; CREDIT's tisr source gives one dynamic forcing variable"),
    (lambda c: c["data"]["source"]["SOLAR"].update(latlon_grid_path="grid.nc"),
     "data.source.SOLAR: give latlon_grid_path, or lat_spec and lon_spec"),
    (lambda c: c["data"]["source"]["SOLAR"].pop("lon_spec"),
     "data.source.SOLAR: give latlon_grid_path, or lat_spec and lon_spec"),
    (lambda c: c.update(model={"image_height": 9, "image_width": 15}),
     "data.source.SOLAR.lon_spec: 16 points, but model.image_width is 15: CREDIT concatenates"),
    (lambda c: c["data"]["source"]["SOLAR"].update(temporal_mode="cyclic"),
     "data.source.SOLAR.temporal_mode: not implemented"),
    (lambda c: c["data"]["source"]["ERA5"]["variables"]["dynamic_forcing"].update(vars_2D=["tsi", "tisr"]),
     "data.source.ERA5.variables.dynamic_forcing: names tisr, which data.source.SOLAR computes too"),
])
def test_what_the_mapping_refuses_is_one_line_naming_the_key(change, line):
    conf = credit_config()
    change(conf)
    conf["validation_data"]["source"] = conf["data"]["source"]
    refused = map_credit_file(conf).refused
    assert len(refused) == 1 and refused[0].startswith(line), refused


def test_the_table_is_found_in_the_credit_checkout_beside_the_file(tmp_path):
    """CREDIT reads the table from its package: a file in a CREDIT checkout's `config/` finds it;
    elsewhere the data say which key to set."""
    checkout = tmp_path / "miles-credit"
    (checkout / "credit" / "metadata").mkdir(parents=True)
    (checkout / "config" / "gen_2").mkdir(parents=True)
    table = checkout / "credit" / "metadata" / tisr.TSI_TABLE
    table.write_bytes((FIXTURE / "tsi_table.nc").read_bytes())
    assert tisr.find_tsi_table(checkout / "config" / "gen_2" / "file.yml") == table
    assert tisr.find_tsi_table(tmp_path / "elsewhere.yml") is None
    mapping = map_credit_file(credit_config())
    cfg = compose_config(list(mapping.overrides))
    with pytest.raises(DataError, match="needs CREDIT's total solar irradiance table.*set data.credit.tisr.tsi_table"):
        build_dataset(cfg.data, "train_period")


def test_a_time_outside_the_table_is_one_error():
    lat, lon = tisr.grid_from_specs(*GRIDS["regional"], "test")
    times, values = tisr.read_tsi_table(FIXTURE / "tsi_table.nc")
    with pytest.raises(DataError, match="the total solar irradiance table covers the years 1990 to 2029"):
        tisr.integrated(pd.Timestamp("2031-01-01"), pd.Timedelta("6h"), 4, lat, lon, times, values)


def test_sample_times_outside_the_table_are_one_error_when_the_dataset_is_built(tmp_path):
    import numpy as np
    import xarray as xr

    years = np.arange(2005.5, 2020.5, dtype=np.float32)
    xr.Dataset({"tsi": ("time", np.full(len(years), 1361.0, np.float32))}, coords={"time": years}).to_netcdf(
        tmp_path / "table.nc")
    mapping = map_credit_file(credit_config())
    cfg = compose_config([*mapping.overrides, f"data.credit.tisr.tsi_table={tmp_path / 'table.nc'}"])
    with pytest.raises(DataError, match=r"tisr at 2000-12-29 18:00:00 .. 2001-01-02 18:00:00: the total solar "
                                        r"irradiance table covers the years 2005 to 2019"):
        build_dataset(cfg.data, "train_period")


def test_the_tisr_keys_are_checked_with_the_config():
    from credit.config import ConfigError

    mapping = map_credit_file(credit_config())
    with pytest.raises(ConfigError, match=r"data.variables.forcing=\['tisr', 'tsi'\] is invalid: ending with 'tisr'"):
        compose_config([*mapping.overrides, "data.variables.forcing=[tisr,tsi]"])
    with pytest.raises(ConfigError, match="data.credit.tisr.source='SOLAR' is invalid: null unless data.layout=credit-gen2"):
        compose_config(["data.credit.tisr.source=SOLAR"])


def test_tisr_may_be_the_only_dynamic_forcing(expected):
    """As in CREDIT's ARCO-ERA5 examples: the files' source has no dynamic forcing, so none of
    its files is read for it; the forcing block is the static fields, then tisr."""
    conf = credit_config()
    conf["data"]["source"]["ERA5"]["variables"]["dynamic_forcing"] = None
    conf["validation_data"]["source"] = conf["data"]["source"]
    cfg, train = _train(conf)
    assert list(cfg.data.variables.forcing) == ["tisr"] and cfg.data.credit.files.dynamic_forcing is None
    assert train.forcing_channel_names == ["Z_GDS4_SFC", "LSM", "tisr"]
    forcing = train[0]["forcing"]
    torch.testing.assert_close(forcing[0, -1], expected["x_normalised"][0, -1, 0], atol=ATOL, rtol=RTOL)
