"""The structured config: every key a run accepts, with its type and its default.

This is the one source of defaults. The YAML groups under `credit/conf/` only hold what a
group chooses differently (e.g. `data/era5.yaml`'s root and periods, `parallelism/*.yaml`'s
layout); a test keeps them from restating a default. Registered with hydra's ConfigStore
as `base_config` (the `model` group's schemas are `credit.config.schema_model`'s), so composing a YAML file or a command-line override with a key not
declared here fails and names the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from credit.config.schema_model import MODEL_SCHEMAS


@dataclass
class DataFiles:
    """Globs relative to `data.root`, one per variable role."""

    upper_air: str = "era5_*.nc"
    surface: str = "era5_*.nc"
    forcing: str = "forcing_*.nc"
    static: str = "static.nc"
    diagnostic: str = "era5_*.nc"
    mean: str = "mean.nc"
    std: str = "std.nc"


@dataclass
class DataVariables:
    upper_air: List[str] = field(default_factory=lambda: ["U", "V", "T", "Q"])
    surface: List[str] = field(default_factory=lambda: ["SP", "t2m"])
    forcing: List[str] = field(default_factory=lambda: ["tsi"])
    static: List[str] = field(default_factory=lambda: ["Z_GDS4_SFC", "LSM"])
    diagnostic: List[str] = field(default_factory=list)


@dataclass
class CreditFiles:
    """CREDIT's gen1 `save_loc*`, `mean_path` and `std_path`: globs of yearly files (the year
    in each name), one file for `forcing` and `static`; relative to `data.root` or absolute.
    gen2 (`data.layout=credit-gen2`): `prognostic`, `dynamic_forcing`, `static`, `diagnostic`
    are CREDIT's path templates (`%Y` ...), `mean`/`std` the era5_normalizer's files."""

    prognostic: Optional[str] = None  # gen2 only
    upper_air: Optional[str] = None
    surface: Optional[str] = None
    dynamic_forcing: Optional[str] = None
    diagnostic: Optional[str] = None
    forcing: Optional[str] = None
    static: Optional[str] = None
    mean: Optional[str] = None
    std: Optional[str] = None
    # gen2: CREDIT's bridgescaler file (its bridgescaler_transform preblock) instead of mean/std,
    # and the one whose target scalers de-normalise the outputs (its inverse postblocks; null: the same)
    bridgescaler: Optional[str] = None
    bridgescaler_inverse: Optional[str] = None


@dataclass
class CreditFillRule:
    """A rule of CREDIT's fill_values preblock: values matching `search` (null: NaN; a number:
    compared with `op`, which NaN never matches) become `fill`."""

    search: Optional[float] = None
    op: str = "=="
    fill: float = 0.0


@dataclass
class CreditTransform:
    """One of CREDIT's pointwise gen2 blocks (credit/interop/pointwise_blocks.py): `kind` log,
    sqrt or fill in `data.credit.transforms` (preblocks, before the scaler), exp or square in
    `data.credit.output_inverse` (postblocks, after the inverse scaler); on `variables` (bare names)."""

    kind: str = "log"
    variables: List[str] = field(default_factory=list)
    base: str = "e"  # log and exp: e, 2 or 10
    eps: float = 1e-8  # log and exp
    rules: List[CreditFillRule] = field(default_factory=list)  # fill


@dataclass
class CreditSolarSource:
    """CREDIT's gen2 `tisr` source (credit/interop/tisr.py), when `source` names it: its
    top-of-atmosphere incident solar radiation, computed for each time; `variable` is the last of
    `data.variables.forcing`.
    The grid is `lat_spec` x `lon_spec` ([start, end, num_points]) or `grid_file`'s; the total
    solar irradiance table is CREDIT's `credit/metadata/total_solar_irradiance_CMIP6_49r1.nc`."""

    source: Optional[str] = None
    variable: str = "tisr"
    integration_steps: int = 360  # trapezoids over the data's time step, ending at each time
    lat_spec: Optional[List[Any]] = None
    lon_spec: Optional[List[Any]] = None
    grid_file: Optional[str] = None
    tsi_table: Optional[str] = None


@dataclass
class CreditGeopotential:
    """CREDIT's `geopotential_diagnostic` postblock (credit/interop/geopotential.py), when
    `output` names its variable: the geopotential on every level of `temperature`, computed from
    the physical outputs and the raw static `surface_geopotential`, scored by the physical-unit
    loss beside the outputs (BaseLoss's `include_computed_diagnostics`). The interface
    coefficients are `level_info_file`'s (CREDIT's `credit/metadata/ERA5_Lev_Info.nc`)."""

    output: Optional[str] = None
    surface_geopotential: str = "geopotential_at_surface"
    surface_pressure: str = "surface_pressure"
    temperature: str = "temperature"
    specific_humidity: str = "specific_humidity"
    flip_vertical: bool = True  # levels run top to surface, as ERA5's model levels
    level_info_file: Optional[str] = None
    a_half_variable: str = "a_half"
    b_half_variable: str = "b_half"
    levels: Optional[List[int]] = None  # the data's model levels (1-based) in the file's; null: all of them
    # CREDIT's var key of the output (SOURCE/TYPE/3d/NAME): with inverse_variance, the variance of
    # that key's target scaler in the bridgescaler file weights it, where the file has one
    output_key: Optional[str] = None


@dataclass
class CreditDataConfig:
    """`data.layout=credit-gen1|credit-gen2`: CREDIT's files as CREDIT's datasets read them
    (credit/interop/data_gen1.py, data_gen2.py). `data.variables.forcing` are CREDIT's
    `dynamic_forcing_variables` (z-scored, from the yearly files); `forcing_file_variables`
    are its `forcing_variables` (one leap-year file, as stored)."""

    files: CreditFiles = field(default_factory=CreditFiles)
    forcing_file_variables: List[str] = field(default_factory=list)
    skip_periods: int = 1  # input frames every k file steps; history_len counts file steps
    static_first: bool = True  # the forcing block: static, dynamic forcing, forcing (else static last)
    clamp: Optional[List[float]] = None  # CREDIT's data_clamp: [low, high] after normalisation
    # gen2 (credit/interop/data_gen2.py): the master clock's step, the files' level coordinate,
    # and the era5_normalizer's `levels` (1-indexed positions on its files' level axis)
    timestep: Optional[str] = None
    level_coord: str = "level"
    stats_levels: Optional[List[int]] = None
    # gen2 with files.bridgescaler: the source whose var keys the file holds, and the variables it
    # scales (bare names; null: every variable the file has a scaler for)
    source_name: str = "ERA5"
    scaled_variables: Optional[List[str]] = None
    # ... and of those, the 2-D variables whose scalers hold one statistic per grid point
    spatial_variables: List[str] = field(default_factory=list)
    # gen2: CREDIT's pointwise preblocks (log, sqrt) in their order, and the postblocks' inverses
    transforms: List[CreditTransform] = field(default_factory=list)
    output_inverse: List[CreditTransform] = field(default_factory=list)
    # gen2: a `tisr` source beside the files' source (source null: none)
    tisr: CreditSolarSource = field(default_factory=CreditSolarSource)
    # gen2: the geopotential_diagnostic postblock's computed variable (output null: none)
    geopotential: CreditGeopotential = field(default_factory=CreditGeopotential)


@dataclass
class GenerateConfig:
    """How the embedded synthetic dataset is made when `data.root` holds none."""

    grid: List[int] = field(default_factory=lambda: [32, 64])
    years: List[int] = field(default_factory=lambda: [2000, 2001])
    train_years: List[int] = field(default_factory=lambda: [2000])
    seed: int = 0


@dataclass
class DataConfig:
    """The embedded synthetic dataset, generated into `root` on first use."""

    root: str = "data/embedded"
    layout: str = "native"  # native (this project's files) | credit-gen1 | credit-gen2 (CREDIT's, see `credit`)
    credit: CreditDataConfig = field(default_factory=CreditDataConfig)
    generate_if_missing: bool = True
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    files: DataFiles = field(default_factory=DataFiles)
    variables: DataVariables = field(default_factory=DataVariables)
    levels: List[float] = field(default_factory=lambda: [300.0, 500.0, 700.0, 850.0])
    level_dim: str = "level"
    train_period: List[str] = field(default_factory=lambda: ["2000-01-01", "2000-12-31"])
    valid_period: List[str] = field(default_factory=lambda: ["2001-01-01", "2001-12-31"])
    history_len: int = 1
    forecast_len: int = 1
    # validation's lead in autoregressive steps; the last is scored (CREDIT's valid_forecast_len + 1)
    valid_forecast_len: int = 1
    normalize: bool = True
    # CREDIT's `save_loc_physics` (relative to `root`, or absolute): the longitude, latitude
    # and levels (pressure, or sigma coefficients) of the conservation post blocks
    physics_file: Optional[str] = None
    nonfinite: str = "error"  # error | skip_sample: a NaN/inf read from a file
    allow_missing_times: bool = False  # a variable lacking times the others have: warn, not fail
    num_workers: int = 0
    valid_samples: int = 64  # validation samples, evenly spaced over valid_period


@dataclass
class OptimizerConfig:
    lr: float = 3e-3  # the default experiment's; fine-tuning a CREDIT checkpoint wants less
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01
    eps: float = 1e-8


@dataclass
class SchedulerConfig:
    warmup_steps: int = 30
    min_lr_ratio: float = 0.05  # cosine decays to lr * min_lr_ratio at total_steps
    # warmup_cosine (this project's) | cosine_restarts | epoch_cosine | epoch_lambda (CREDIT's
    # cosine-annealing-restarts, cosine-annealing and lambda: credit/train/schedule.py)
    type: str = "warmup_cosine"
    total_steps: int = 0  # where the cosine ends; 0: trainer.max_steps
    warmup_from_zero: bool = False  # warm-up lr = lr x step / warmup_steps (CREDIT's), not (step + 1)
    first_cycle_steps: int = 0  # cosine_restarts: the first cycle's steps
    cycle_mult: float = 1.0  # cosine_restarts: each cycle's length after warm-up, times the last's
    gamma: float = 1.0  # cosine_restarts: each cycle's peak lr, times the last's
    t_max_epochs: int = 0  # epoch_cosine: epochs from lr to the floor (torch's T_max)


@dataclass
class CheckpointConfig:
    every_n_steps: int = 50  # 0: only at the end of the run
    keep_latest_k: int = 2


@dataclass
class ParallelismConfig:
    data: str = "none"  # fsdp2 | ddp | none, over the dp = world_size / (ensemble x tensor) replicas
    tensor: int = 1  # tensor-parallel degree
    # ranks a sample's ensemble members are spread over (the mesh's "ens" axis, between dp and
    # tp; it divides trainer.ensemble_size): 1 keeps every member of a sample on one rank
    ensemble: int = 1
    activation_checkpointing: bool = False
    mixed_precision: str = "none"  # none | bf16 (bf16 parameters, fp32 gradient reduction)
    # fsdp2 only: free gathered weights after each unit's forward (gather again for backward)
    reshard_after_forward: bool = True
    # fsdp2 only: block (one unit per block) | grouped (one unit per mesh: fewest collectives)
    shard_granularity: str = "block"
    # tensor > 1: the transformer stages' rows split over the tp ranks (CREDIT's three classes)
    sequence_parallel: bool = False
    # with sequence_parallel: blocks keep just their rows of each gathered input for backward
    # and gather it again there (less memory, one more all-gather per block)
    sequence_parallel_regather: bool = True


@dataclass
class EMAConfig:
    enabled: bool = False
    decay: float = 0.999


@dataclass
class LossConfig:
    # the elementwise error, CREDIT's deterministic losses: mse | mae | huber | logcosh |
    # xtanh | xsigmoid | msle (credit/train/losses.py); with trainer.ensemble_size > 1 a CRPS
    # over the members: kcrps | almost_fair_crps (credit/train/ensemble.py)
    function: str = "mse"
    huber_delta: float = 1.0  # huber: quadratic within |error| < delta, linear outside
    # per output variable, another deterministic error than `function` (BaseLoss's overrides):
    # NAME: {function: mae, huber_delta: 1.0} (huber_delta optional, for huber)
    overrides: Dict[str, Any] = field(default_factory=dict)
    crps_alpha: float = 1.0  # almost_fair_crps: 1 is the fair CRPS; below 1 rewards spread less
    latitude_weighting: bool = True
    # per variable: one weight, or one per level of an upper-air variable (CREDIT's); default 1.0
    variable_weights: Dict[str, Any] = field(default_factory=dict)
    normalize_variable_weights: bool = True  # divide by their mean (CREDIT: false, the weights as given)
    # the error on normalized values, or on physical ones (de-normalised with the data's target
    # statistics: CREDIT's gen2 BaseLoss behind its inverse-scaler postblocks)
    space: str = "normalized"
    # mean over every channel, or each variable's mean then the mean over variables (BaseLoss)
    combine: str = "channels"
    # each variable's weight divided by its variance (the mean of its channels' std^2): BaseLoss's
    # var_weighting: inverse_variance
    inverse_variance: bool = False
    # each variable's weight learned (BaseLoss's var_weighting: learnable): m_v exp(-s_v) L_v + 0.5 s_v,
    # s_v from log(variance), trained beside the model (credit/train/learned_variance.py)
    learnable_variance: bool = False
    # how a multi-step forecast's step losses combine: mean | sum (CREDIT's trainers: each
    # step's loss backpropagated, i.e. summed)
    forecast_steps: str = "mean"


@dataclass
class CreditStartConfig:
    """Start from a checkpoint CREDIT's trainer wrote (CREDIT's `trainer.load_weights`), when
    run_dir holds no checkpoint of this project (a later job resumes from its own)."""

    checkpoint: str = ""  # CREDIT's checkpoint.pt; "": start fresh
    optimizer: bool = False  # its AdamW moments and step counts (CREDIT's load_optimizer)
    # continue at its epoch + 1, the schedule at its step (CREDIT's reload_epoch)
    reload_epoch: bool = False
    # CREDIT's trainer.mode fsdp files: the weights from model_checkpoint.pt and the AdamW state
    # from optimizer_checkpoint.pt beside `checkpoint` (which then holds the epoch)
    fsdp: bool = False


@dataclass
class TrainerConfig:
    max_steps: int = 200
    steps_per_job: int = 0  # stop this job after N steps (checkpointed); 0: run to max_steps
    seed: int = 42
    resume: str = "auto"  # auto | never | path to a checkpoint
    device: str = "auto"  # auto | cpu | cuda
    batch_size: int = 16  # per data-parallel rank
    # members per sample (> 1: an ensemble on the batch axis, scored by a CRPS loss function;
    # credit/train/ensemble.py); trainer.batch_size counts samples, the model sees batch x members
    ensemble_size: int = 1
    grad_accum_steps: int = 1
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # CREDIT's grad_max_norm: dynamic: clip to sqrt(dp ranks x the norm) (grad_clip unused)
    grad_clip_dynamic: bool = False
    epochs: int = 0  # > 0: max_steps = epochs x the batches of one pass over the training set
    epochs_per_job: int = 0  # > 0: steps_per_job = epochs_per_job x those batches
    valid_every_n_steps: int = 50  # 0: validate only at the end
    progress_bar: bool = True  # tqdm on a terminal; a plain line every log_every_n_steps otherwise
    log_every_n_steps: int = 50
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    credit_start: CreditStartConfig = field(default_factory=CreditStartConfig)


@dataclass
class InitRangeConfig:
    """Init times start, start + every_hours, ... up to end (inclusive); used when
    `rollout.init_times` is empty."""

    start: str = "${data.valid_period.0}"
    end: str = "${.start}"
    every_hours: int = 24


@dataclass
class RolloutConfig:
    checkpoint: str = "auto"  # auto (latest complete in run_dir/checkpoints) | a DCP directory
    weights: str = "auto"  # auto (EMA when stored) | ema | model
    init_times: List[str] = field(default_factory=list)  # ISO times; when given, init_range is unused
    init_range: InitRangeConfig = field(default_factory=InitRangeConfig)
    lead_steps: int = 8  # autoregressive steps of the data's time step
    # ensemble members forecast from each init time (a noise-injecting model's: docs/ensembles.md);
    # > 1 writes a realization dimension and scores CRPS, spread and spread-skill
    members: int = 1
    output_dir: str = "${run_dir}/forecasts"
    overwrite: bool = False
    complevel: int = 4  # zlib level of the netCDF variables; 0: uncompressed
    skill: bool = True  # skill.csv and plots against the dataset's truth
    climatology_samples: int = 64  # training-period times averaged into the ACC climatology
    map_channel: str = ""  # channel mapped, e.g. T_500 or t2m; empty: the first one
    progress_bar: bool = True


@dataclass
class SDCInjectConfig:
    """One bit flipped once, to qualify the detector (docs/sdc.md): `kind` none | gemm_output
    (a Linear's forward output) | all_gather (its weight as FSDP2 gathered it) | grad_shard
    (its weight's reduce-scattered gradient shard), on `rank` at `step` (a checked step)."""

    kind: str = "none"
    layer: str = ""  # module path of an nn.Linear, e.g. stages.0.layers.0.0.to_q
    rank: int = 0
    step: int = 0  # 1-based, as in metrics.csv
    bit: int = 22  # bit of the element's raw bits (22: fp32's top mantissa bit; 0..15 for bf16)
    index: int = 0  # element: gemm_output: column of the row the compute check recomputes;
    # all_gather / grad_shard: flat index in the weight's gathered tensor / gradient shard


@dataclass
class SDCConfig:
    """Silent-data-corruption checks in the training step (docs/sdc.md)."""

    enabled: bool = False
    every_n_steps: int = 10  # steps 10, 20, ... are checked
    action: str = "warn"  # warn | stop | rollback (reload the last verified checkpoint)
    checks: List[str] = field(default_factory=lambda: ["comm", "replica", "compute"])
    inject: SDCInjectConfig = field(default_factory=SDCInjectConfig)


@dataclass
class DiagnosticsConfig:
    sdc: SDCConfig = field(default_factory=SDCConfig)


@dataclass
class Config:
    run_dir: str = "runs/default"
    model: Any = None  # one of MODEL_SCHEMAS, chosen by the `model` group
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="base_config", node=Config)
    for name, schema in MODEL_SCHEMAS.items():
        store.store(group="model", name=name, node=schema)
