"""Models: CREDIT's crossformer and wxformer_next (`from_credit` loads CREDIT's checkpoints),
the Linear-based wxformer and its helpers (padding, spectral norm), and the wxformer's
earlier convolutional layout with its state-dict remapping."""

from credit.models.build import build_model, model_spec
from credit.models.credit_checkpoint import CreditCheckpointError, from_credit
from credit.models.ema import EMA
from credit.models.inputs import model_input
from credit.models.legacy import LegacyWXFormer, build_legacy_model
from credit.models.remap import RemapError, remap_conv_state_dict
from credit.models.spectral_norm import advance_spectral_norm, apply_spectral_norm, has_spectral_norm
from credit.models.wxformer import WXFormer, WXFormerSpec

__all__ = [
    "CreditCheckpointError",
    "EMA",
    "LegacyWXFormer",
    "RemapError",
    "WXFormer",
    "WXFormerSpec",
    "advance_spectral_norm",
    "apply_spectral_norm",
    "build_legacy_model",
    "build_model",
    "from_credit",
    "has_spectral_norm",
    "model_input",
    "model_spec",
    "remap_conv_state_dict",
]
