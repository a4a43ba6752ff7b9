"""CREDIT's post blocks give CREDIT's numbers.

tests/fixtures/credit_postblocks/ (see its README) holds, per fixer, a small CREDIT config
with its data section, mean/std and physics files, a checkpoint, an input, CREDIT's output
with the post blocks and CREDIT's output without them. Two checks:

- the arithmetic: our post blocks applied to CREDIT's own model output give CREDIT's
  post-processed output bit for bit;
- end to end: `from_credit` (our model, then our post blocks) against CREDIT's output,
  per channel in physical units within 1e-5 of the channel's largest value, beyond the
  rounding grid of the moisture the mass fixer rescales (tests/credit_fixtures.py). (In normalised
  units a fixer's float32 quantum can be larger: the mass fixer computes 1 - (1 - q)·r, whose
  resolution of 6e-8 in q is 1e-4 of q's standard deviation.)
"""

from pathlib import Path

import pytest
import torch
import yaml
from credit_fixtures import physical_difference

from credit.models.credit.checkpoint import from_credit
from credit.models.credit.postblocks import PostBlockConfigError, build_post_blocks

FIXTURES = Path(__file__).parent.parent / "fixtures" / "credit_postblocks"
NAMES = sorted(folder.name for folder in FIXTURES.iterdir() if (folder / "credit.yml").exists())


def _load(name: str) -> torch.nn.Module:
    model = from_credit(FIXTURES / name / "credit.yml", FIXTURES / name / "checkpoint.pt")
    assert model.post_blocks is not None
    return model


def test_every_fixer_has_a_fixture():
    fixers = set()
    for name in NAMES:
        post_conf = yaml.safe_load((FIXTURES / name / "credit.yml").read_text())["model"]["post_conf"]
        fixers |= {k for k, v in post_conf.items() if isinstance(v, dict) and v.get("activate")}
    assert {"tracer_fixer", "global_mass_fixer", "global_water_fixer", "global_energy_fixer"} <= fixers


@pytest.mark.parametrize("name", NAMES)
def test_post_blocks_on_credits_model_output_are_credits_bit_for_bit(name):
    model = _load(name)
    folder = FIXTURES / name
    without, credit = torch.load(folder / "output_without_postblocks.pt"), torch.load(folder / "output.pt")
    with torch.no_grad():
        fixed = model.post_blocks(without, torch.load(folder / "input.pt"))
    assert not torch.equal(without, credit)  # the fixers really change the forecast
    assert torch.equal(fixed, credit)


@pytest.mark.parametrize("name", NAMES)
def test_from_credit_with_post_blocks_forecasts_credits_numbers(name):
    model = _load(name)
    with torch.no_grad():
        ours = model(torch.load(FIXTURES / name / "input.pt"))
    # measured spread beyond the mass fixer's rounding grid: 0.3-1.6e-6 on every CPU path tried; 6x
    assert physical_difference(model, ours, torch.load(FIXTURES / name / "output.pt")) <= 1e-5


@pytest.mark.parametrize("change, named", [
    (lambda c: c["data"].update(save_loc_physics="missing.nc"), "data.save_loc_physics=missing.nc: no such file"),
    (lambda c: c["data"].update(mean_path="nowhere/mean.nc"), "data.mean_path=nowhere/mean.nc: no such file"),
    (lambda c: c["model"]["post_conf"]["global_energy_fixer"].update(air_temperature_name=["TT"]),
     "post_conf.global_energy_fixer.air_temperature_name=['TT'] names no output channel"),
    (lambda c: c["model"]["post_conf"]["global_mass_fixer"].pop("fix_level_num"),
     "post_conf.global_mass_fixer.fix_level_num is not set"),
    (lambda c: c["model"]["post_conf"]["global_water_fixer"].update(simple_demo=True),
     "post_conf.global_water_fixer.simple_demo=true"),
    (lambda c: c["model"]["post_conf"].update(skebs={"activate": True}), "post_conf.skebs is active"),
    (lambda c: c["data"].update(scaler_type="quantile"), "data.scaler_type='quantile'"),
])
def test_a_post_block_that_cannot_be_built_is_one_error_naming_the_key(change, named):
    folder = FIXTURES / "crossformer_all_fixers_sigma"
    config = yaml.safe_load((folder / "credit.yml").read_text())
    change(config)
    with pytest.raises(PostBlockConfigError) as error:
        build_post_blocks(config, folder)
    assert named in str(error.value)


def test_a_fixer_outside_the_model_runs_after_it_as_credits_trainer_runs_it(tmp_path):
    """The energy fixer, CREDIT's last, moved outside the model: the model's forward runs the
    other three, `predict`'s step then runs it, and a first step (initial state = input)
    gives CREDIT's all-inside output bit for bit."""
    folder = FIXTURES / "crossformer_all_fixers_sigma"
    config = yaml.safe_load((folder / "credit.yml").read_text())
    config["model"]["post_conf"]["global_energy_fixer"]["activate_outside_model"] = True
    model = from_credit({**config, "data": {**config["data"], **{
        k: str(folder / config["data"][k]) for k in ("mean_path", "std_path", "save_loc_physics")}}},
        folder / "checkpoint.pt")
    assert [type(f).__name__ for f in model.post_blocks.fixers] == ["TracerFixer", "GlobalMassFixer",
                                                                    "GlobalWaterFixer"]
    assert [type(f).__name__ for f in model.outside_post_blocks.fixers] == ["GlobalEnergyFixer"]
    x, without = torch.load(folder / "input.pt"), torch.load(folder / "output_without_postblocks.pt")
    with torch.no_grad():
        inside = model.post_blocks(without, x)
        fixed = model.outside_post_blocks(inside, x, x)
    assert not torch.equal(inside, fixed)
    assert torch.equal(fixed, torch.load(folder / "output.pt"))


def test_a_gen2_data_section_gives_the_same_fixers(tmp_path):
    """The tracer fixture's config rewritten in CREDIT's gen2 schema (`data.source.ERA5`,
    the normaliser's mean/std under `preblocks`) over statistics files with one more level
    than the config selects: the fixers pick the channels and levels CREDIT's gen2 rollout
    picks, and give CREDIT's post-processed output bit for bit."""
    import xarray as xr

    folder = FIXTURES / "crossformer_tracer_fixer"
    config = yaml.safe_load((folder / "credit.yml").read_text())
    for name in ("mean", "std"):
        with xr.open_dataset(folder / f"{name}.nc") as ds:
            ds = ds.load()
            upper = [v for v in ds.data_vars if "level" in ds[v].dims]
            extra = ds[upper].isel(level=[0]).assign_coords(level=[250]) * 1e3
            wider = xr.concat([extra, ds[upper]], dim="level").merge(ds.drop_vars(upper), join="outer")
            wider.to_netcdf(tmp_path / f"{name}.nc")
    config["data"] = {"source": {"ERA5": {"level_coord": "level", "levels": [500, 850, 1000], "variables": {
        "prognostic": {"vars_3D": ["U", "V", "T", "Q"], "vars_2D": ["SP", "t2m", "Q500"], "path": "x_%Y.zarr"},
        "diagnostic": {"vars_2D": ["tp"], "path": "x_%Y.zarr"},
        "dynamic_forcing": {"vars_2D": ["tsi"], "path": "x_%Y.zarr"}}}},
        "timestep": "6h", "history_len": 1, "forecast_len": 1}
    config["preblocks"] = {"per_step": {"norm": {"type": "era5_normalizer", "args": {
        "mean_path": "mean.nc", "std_path": "std.nc"}}}}
    gen2 = build_post_blocks(config, tmp_path)
    without = torch.load(folder / "output_without_postblocks.pt")
    with torch.no_grad():
        fixed = gen2.inside(without, torch.load(folder / "input.pt"))
    assert torch.equal(fixed, torch.load(folder / "output.pt"))
    config["preblocks"] = {}
    with pytest.raises(PostBlockConfigError, match="preblocks.norm.args.mean_path is needed"):
        build_post_blocks(config, tmp_path)
