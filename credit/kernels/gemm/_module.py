"""``DetLinear``: a drop-in ``nn.Linear`` whose forward is ``det_linear``."""

from __future__ import annotations

import torch
from torch import nn

from ._ops import _is_dtensor, linear_local
from ._tree import LEAF


class DetLinear(nn.Linear):
    """``nn.Linear`` computed with the deterministic, batch-invariant GEMM.

    Same constructor, parameters and ``state_dict`` keys as ``nn.Linear``
    (``backend`` is a plain attribute, not state), so checkpoints load either
    way and torch tensor-parallel styles accept it.  DTensor weights from
    ``ColwiseParallel`` / ``RowwiseParallel`` on a 1-D mesh are supported (see
    ``_dtensor.py``); other layouts are rejected with an error.
    """

    # a tensor-parallel split of either width must give each rank whole K leaves, so the
    # ranks' partial sums are subtrees of the one-rank reduction (`credit.parallel`
    # keeps a block whole on every tp rank otherwise)
    tp_split_multiple = LEAF

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        backend: str = "auto",
        group_rows: bool = False,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.backend = backend
        # True: the input's leading dimension indexes samples, and each sample's rows are
        # padded to whole 32-row leaves in dW / dbias (so a batch split at sample boundaries
        # is a split of the row tree, whatever the rows per sample).
        self.group_rows = group_rows
        self.whole_reductions = (False, False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, backend: str = "auto") -> DetLinear:
        """A ``DetLinear`` sharing ``linear``'s parameters (no copy)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias  # None registers an absent bias, as nn.Linear does
        new.backend = backend
        new.group_rows = False
        new.whole_reductions = (False, False)
        return new

    # (forward K, input-gradient N): True where no tensor-parallel split ever cuts that
    # reduction, whatever the layout, so the triton backend may run it as one MMA chain
    # instead of the K tree (faster; the bits still never depend on the layout). Set from the
    # blocks' `_tp_plan`s by `credit.models.layer_kit.mark_whole_reductions`; (False, False),
    # the tree for both, is right for any layer.
    whole_reductions: tuple[bool, bool]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        groups = input.shape[0] if self.group_rows and input.dim() > 2 else 1
        if _is_dtensor(self.weight) or _is_dtensor(input):
            from ._dtensor import dtensor_linear

            return dtensor_linear(input, self.weight, self.bias, self.backend, groups,
                                  self.whole_reductions)
        return linear_local(input, self.weight, self.bias, self.backend, groups=groups,
                            whole=self.whole_reductions)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"
