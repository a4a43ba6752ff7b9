"""One training step of a model with indexed dropout on, for the tensor-parallel bitwise
tests: the loss and output it gives, and a full tensor of any (possibly sharded) one; and the
tiny CREDIT models (16x32 grid, spectral norm and dropout on) and batch those tests use."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from credit.models.dropout import dropout_step


def step_with_dropout(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward with dropout at (seed 7, step 3), mean-square loss, backward: (loss, output)."""
    with dropout_step(seed=7, step=3, sample_offset=0, local_batch=x.shape[0]):
        y = model(x)
    loss = y.square().mean()
    loss.backward()
    return loss.detach(), y.detach()


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


# CREDIT's constructor arguments for a 16x32 grid; the tests add `dim`
TINY_CREDIT = dict(image_height=16, image_width=32, frames=1, channels=2, levels=2, surface_channels=1,
                   input_only_channels=2, output_only_channels=1, depth=[1, 1, 1, 1],
                   dim_head=32, local_window_size=[2, 2, 2, 1], global_window_size=[2, 2, 1, 1],
                   cross_embed_kernel_sizes=[[2, 4]] * 4, cross_embed_strides=[2, 2, 2, 2],
                   attn_dropout=0.1, ff_dropout=0.1, use_spectral_norm=True)
TINY_MODELS = {
    # the older CrossFormer: transposed-convolution decoder (kernel 2 and the kernel-4 head)
    # with CREDIT's depthwise squeeze-excitation after each up block
    "crossformer": dict(type="crossformer", attention_type="scse_optimized",
                        padding_conf=dict(activate=True, mode="earth", pad_lat=[8, 8], pad_lon=[0, 0])),
    "wxformer": dict(type="wxformer",
                     padding_conf=dict(activate=True, mode="earth", pad_lat=[8, 8], pad_lon=[0, 0])),
    "nextgen_wxformer": dict(type="nextgen_wxformer", col_attn_heads=2, num_spectral_nodes=8),
}


def tiny_batch(n: int, height: int = 16) -> torch.Tensor:
    """A smooth (n, 7, 1, height, 32) input for the tiny models."""
    i = torch.arange(n * 7 * height * 32, dtype=torch.float64)
    return torch.sin(i * 0.37).view(n, 7, 1, height, 32).float()
