"""Models: the Linear-based wxformer and its helpers (padding, spectral norm)."""

from credit.models.build import build_model, model_spec, tp_planned_modules
from credit.models.wxformer import WXFormer, WXFormerSpec, apply_spectral_norm

__all__ = [
    "WXFormer",
    "WXFormerSpec",
    "apply_spectral_norm",
    "build_model",
    "model_spec",
    "tp_planned_modules",
]
