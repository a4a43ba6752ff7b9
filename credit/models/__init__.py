"""Models: CREDIT's crossformer, wxformer and nextgen_wxformer (`from_credit` loads CREDIT's checkpoints;
`remap_conv_state_dict` turns CREDIT's convolutional layout into the Linear one), this
project's compact windowformer, and their helpers (padding, spectral norm, EMA)."""

from credit.models.build import attach_post_blocks, build_model, model_spec
from credit.models.credit_checkpoint import CreditCheckpointError, from_credit
from credit.models.ema import EMA
from credit.models.inputs import model_input
from credit.models.credit_remap import RemapError, remap_conv_state_dict
from credit.models.spectral_norm import advance_spectral_norm, apply_spectral_norm, has_spectral_norm
from credit.models.windowformer import WindowFormer, WindowFormerSpec

__all__ = [
    "CreditCheckpointError",
    "EMA",
    "RemapError",
    "WindowFormer",
    "WindowFormerSpec",
    "advance_spectral_norm",
    "apply_spectral_norm",
    "attach_post_blocks",
    "build_model",
    "from_credit",
    "has_spectral_norm",
    "model_input",
    "model_spec",
    "remap_conv_state_dict",
]
