"""``DetLinear``: a drop-in ``nn.Linear`` whose forward is ``det_linear``."""

from __future__ import annotations

import torch
from torch import nn

from ._ops import _is_dtensor, det_linear


class DetLinear(nn.Linear):
    """``nn.Linear`` computed with the deterministic, batch-invariant GEMM.

    Same constructor, parameters and ``state_dict`` keys as ``nn.Linear``
    (``backend`` is a plain attribute, not state), so checkpoints load either
    way and torch tensor-parallel styles accept it.  DTensor weights from
    ``ColwiseParallel`` / ``RowwiseParallel`` on a 1-D mesh are supported (see
    ``_dtensor.py``); other layouts are rejected with an error.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.backend = backend

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, backend: str = "auto") -> DetLinear:
        """A ``DetLinear`` sharing ``linear``'s parameters (no copy)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias  # None registers an absent bias, as nn.Linear does
        new.backend = backend
        return new

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if _is_dtensor(self.weight) or _is_dtensor(input):
            from ._dtensor import dtensor_linear

            return dtensor_linear(input, self.weight, self.bias, self.backend)
        return det_linear(input, self.weight, self.bias, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"
