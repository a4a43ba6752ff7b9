"""The `model.*` part of the structured config: one schema per model (`model=NAME`), with
CREDIT's shared keys and its post-block sections. Defaults live here and nowhere else
(`credit.config.schema` holds the rest of the config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class WindowFormerConfig:
    """This project's compact windowformer (`model=windowformer`), sized for the embedded 32x64 grid."""

    name: str = "windowformer"
    # width of each encoder stage; 128 at stage 0 gives deterministic mode whole 32-wide GEMM
    # leaves per rank up to tp=4 (docs/determinism.md)
    dim: List[int] = field(default_factory=lambda: [128, 128, 256])
    depth: List[int] = field(default_factory=lambda: [1, 1, 1])  # transformer rounds per stage
    dim_head: int = 16
    local_window_size: List[int] = field(default_factory=lambda: [4, 4, 2])
    global_window_size: List[int] = field(default_factory=lambda: [4, 2, 2])
    cross_embed_kernel_sizes: List[List[int]] = field(
        default_factory=lambda: [[2, 4], [2, 4], [2, 4]]
    )
    cross_embed_strides: List[int] = field(default_factory=lambda: [2, 2, 2])
    ff_mult: int = 4
    attn_dropout: float = 0.0
    ff_dropout: float = 0.0
    use_spectral_norm: bool = False
    spectral_norm_tp: str = "shard"  # shard | replicate: spectral-normed blocks under tensor parallelism
    padding: str = "earth"  # earth | none
    gemm: str = "fast"  # fast | deterministic: layout-invariant bits (docs/determinism.md)


@dataclass
class CreditModelConfig:
    """Keys shared by CREDIT's architectures: CREDIT's constructor arguments, names and
    meanings. The grid and channel keys default to null, meaning "from the data"; when set
    they must equal what the data give (one error naming the key otherwise). Sized for the
    embedded 32x64 grid."""

    name: str = "wxformer"
    image_height: Optional[int] = None
    image_width: Optional[int] = None
    frames: Optional[int] = None  # = data.history_len
    channels: Optional[int] = None  # upper-air variables
    levels: Optional[int] = None
    surface_channels: Optional[int] = None
    input_only_channels: Optional[int] = None  # forcing + static variables
    output_only_channels: Optional[int] = None  # diagnostic variables
    dim: List[int] = field(default_factory=lambda: [32, 64, 128, 256])
    depth: List[int] = field(default_factory=lambda: [1, 1, 1, 1])
    dim_head: int = 8
    # windows tile the stages of 32x64 and of 16x32 grids (CREDIT's defaults also end in 1)
    global_window_size: List[int] = field(default_factory=lambda: [4, 2, 2, 1])
    local_window_size: List[int] = field(default_factory=lambda: [4, 4, 2, 1])
    cross_embed_kernel_sizes: List[List[int]] = field(
        default_factory=lambda: [[2, 4], [2, 4], [2, 4], [2, 4]]
    )
    cross_embed_strides: List[int] = field(default_factory=lambda: [2, 2, 2, 2])
    attn_dropout: float = 0.0
    ff_dropout: float = 0.0
    use_spectral_norm: bool = False
    spectral_norm_tp: str = "shard"  # shard | replicate: spectral-normed blocks under tensor parallelism
    gemm: str = "fast"  # fast | deterministic: layout-invariant bits (docs/determinism.md)


@dataclass
class PaddingConf:
    """CREDIT's `padding_conf`: earth (poles rolled half a turn, longitude wrapped) or mirror."""

    activate: bool = False
    mode: str = "earth"
    pad_lat: List[int] = field(default_factory=lambda: [0, 0])
    pad_lon: List[int] = field(default_factory=lambda: [0, 0])


@dataclass
class TracerFixerConf:
    """CREDIT's `tracer_fixer`: each named tracer held at or above its threshold (and below
    `tracer_thres_max` when set), inside the model's forward."""

    activate: bool = False
    denorm: bool = True  # work in physical units (the data's mean and std)
    tracer_name: List[str] = field(default_factory=list)
    tracer_thres: List[float] = field(default_factory=list)
    tracer_thres_max: Optional[List[float]] = None


@dataclass
class ConservationFixerConf:
    """Keys shared by CREDIT's conservation fixers. The grid comes from `data.physics_file`:
    `lon_lat_level_name` names its longitude, latitude and pressure (or the sigma-level
    coefficients a, b); CREDIT's water and energy fixers read these three keys from the mass
    fixer's section, and so does this project."""

    activate: bool = False
    # CREDIT's trainer and rollout apply it after the model: the mass fixer against the
    # forecast's initial state, the others against each step's input
    activate_outside_model: bool = False
    denorm: bool = True
    specific_total_water_name: List[str] = field(default_factory=list)
    surface_pressure_name: List[str] = field(default_factory=list)  # sigma levels


@dataclass
class MassFixerConf(ConservationFixerConf):
    """CREDIT's `global_mass_fixer`: the global dry-air mass of the input kept."""

    grid_type: str = "pressure"  # pressure | sigma
    midpoint: bool = False  # quantities between the levels (sigma: a, b are interfaces)
    fix_level_num: int = 1  # pressure levels: the lowest levels whose moisture is rescaled
    lon_lat_level_name: List[str] = field(default_factory=list)


@dataclass
class WaterFixerConf(ConservationFixerConf):
    """CREDIT's `global_water_fixer`: precipitation closes the global water budget."""

    precipitation_name: List[str] = field(default_factory=list)
    evaporation_name: List[str] = field(default_factory=list)


@dataclass
class EnergyFixerConf(ConservationFixerConf):
    """CREDIT's `global_energy_fixer`: temperature closes the global energy budget."""

    air_temperature_name: List[str] = field(default_factory=list)
    u_wind_name: List[str] = field(default_factory=list)
    v_wind_name: List[str] = field(default_factory=list)
    surface_geopotential_name: List[str] = field(default_factory=list)  # a variable of the physics file
    TOA_net_radiation_flux_name: List[str] = field(default_factory=list)
    surface_net_radiation_flux_name: List[str] = field(default_factory=list)
    surface_energy_flux_name: List[str] = field(default_factory=list)


@dataclass
class PostConf:
    """CREDIT's `post_conf` (docs/credit_models.md, "Post blocks"): fixers applied to every
    forecast step in training, validation and `credit rollout`, on the output channels of
    `data.variables`, de-normalised with the data's mean and std."""

    activate: bool = False
    tracer_fixer: TracerFixerConf = field(default_factory=TracerFixerConf)
    global_mass_fixer: MassFixerConf = field(default_factory=MassFixerConf)
    global_water_fixer: WaterFixerConf = field(default_factory=WaterFixerConf)
    global_energy_fixer: EnergyFixerConf = field(default_factory=EnergyFixerConf)


@dataclass
class WXFormerConfig(CreditModelConfig):
    """CREDIT's `wxformer` / `wxformer_base`, the current CrossFormer with a sub-pixel
    decoder (`model=wxformer`)."""

    name: str = "wxformer"
    interp: bool = True
    padding_conf: PaddingConf = field(default_factory=PaddingConf)
    post_conf: PostConf = field(default_factory=PostConf)


@dataclass
class CrossFormerConfig(CreditModelConfig):
    """CREDIT's `crossformer`, the older CrossFormer with a transposed-convolution (or
    bilinear + convolution) decoder and optional decoder attention (`model=crossformer`)."""

    name: str = "crossformer"
    interp: bool = True
    padding_conf: PaddingConf = field(default_factory=PaddingConf)
    post_conf: PostConf = field(default_factory=PostConf)
    upsample_v_conv: bool = False  # bilinear x2 + 3x3 convolution instead of ConvTranspose2d
    attention_type: Optional[str] = None  # decoder attention: null | coordinate | eca | spatial | scse_optimized | scse_standard | mixed


@dataclass
class CrossFormerEnsembleConfig(CrossFormerConfig):
    """CREDIT's `crossformer-ensemble` (`crossformer-style`): the older CrossFormer with noise
    layers in its encoder and decoder (`model=crossformer-ensemble`; docs/ensembles.md)."""

    name: str = "crossformer-ensemble"
    noise_latent_dim: int = 128  # the latent noise vector each layer maps to its channels' style
    encoder_noise_factor: float = 0.05
    decoder_noise_factor: float = 0.275
    encoder_noise: bool = True  # noise after the first three encoder stages too
    freeze: bool = True  # only the noise layers train (fine-tuning a deterministic CrossFormer)
    correlated: bool = False  # one latent vector per forward for every layer


@dataclass
class WXFormerNextConfig(CreditModelConfig):
    """CREDIT's `nextgen_wxformer`, NextGenWXFormer (`model=nextgen_wxformer`)."""

    name: str = "nextgen_wxformer"
    col_attn_heads: int = 2
    col_attn_stride: int = 1
    decoder_col_attn: bool = False
    num_spectral_nodes: int = 16


# `model=NAME` picks one of these schemas (ConfigStore group "model")
MODEL_SCHEMAS = {"windowformer": WindowFormerConfig, "crossformer": CrossFormerConfig,
                 "crossformer-ensemble": CrossFormerEnsembleConfig, "wxformer": WXFormerConfig,
                 "nextgen_wxformer": WXFormerNextConfig}
