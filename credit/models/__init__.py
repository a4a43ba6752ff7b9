"""Models, one package per family: `credit` (CREDIT's crossformer, wxformer and nextgen_wxformer;
`from_credit` loads CREDIT's checkpoints, `remap_conv_state_dict` turns CREDIT's convolutional
layout into the Linear one) and `windowformer` (this project's compact model); the layers of
deterministic mode both build from (`deterministic`, picked by `layer_kit`), and their shared
helpers (padding, windows, spectral norm, dropout, EMA, input layouts)."""

from credit.models.build import attach_post_blocks, build_model, model_spec
from credit.models.credit.checkpoint import CreditCheckpointError, from_credit
from credit.models.ema import EMA
from credit.models.inputs import model_input
from credit.models.credit.remap import RemapError, remap_conv_state_dict
from credit.models.spectral_norm import advance_spectral_norm, apply_spectral_norm, has_spectral_norm
from credit.models.windowformer.model import WindowFormer, WindowFormerSpec

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
