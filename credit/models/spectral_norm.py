"""Spectral normalisation that runs on tensor-parallel shards (`model.use_spectral_norm`).

A normalised layer keeps its own `weight` parameter (the raw, unnormalised W, which tensor
parallelism shards like any Linear weight) and two buffers, `weight_u` (h) and `weight_v`
(w), the power-iteration vectors for W viewed as an (h, w) matrix (rows = output channels;
for a transposed convolution, as torch does, its second dimension). Its forward computes
the layer with W / σ, σ = uᵀ W v, from whatever block of W this rank holds
(`credit.models.power_iteration`), so one implementation serves every layout. The layer's
own forward reads `self.weight`: the normalised tensor stands in for the parameter during
that call (as FSDP2 swaps in its unsharded parameters), so Linear, the deterministic
DetLinear and the convolutions need no spectral-norm variant each. torch's parametrization
would rename the parameter (`parametrizations.weight.original`), which the tensor-parallel
styles cannot shard.

u and v advance by `iterations` power-iteration steps once per optimizer step: the
trainer calls `advance_spectral_norm(model)` and the next training forward performs them
(torch's hook advances on every training forward; the same with one micro-batch and no
activation checkpointing, and here a checkpointed recompute or a second micro-batch sees
the same σ). Being buffers, u and v are saved in checkpoints, not averaged by EMA and not
touched by the optimizer.

State-dict keys: `weight` (raw), `weight_u`, `weight_v`. Hook-style checkpoints (torch's
`nn.utils.spectral_norm`: `weight_orig`, `weight_u`, `weight_v`) map onto them by renaming
`weight_orig` (`credit.models.remap`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from credit.models.power_iteration import (WHOLE, Block, Products, normalization_backward, normalized, power_iterate,
                                           sigma)

INIT_ITERATIONS = 15  # at construction, so σ is accurate from the first step
_LAYERS = (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)
_CLASSES: dict[type, type] = {}


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _block_of(weight: torch.Tensor) -> tuple[torch.Tensor, Block, Callable[[torch.Tensor], torch.Tensor]]:
    """(local tensor, where it lies in W, how to wrap a local result like `weight`)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(weight, DTensor):
        return weight, WHOLE, lambda t: t
    mesh, placements = weight.device_mesh, weight.placements

    def wrap(t: torch.Tensor) -> torch.Tensor:
        return DTensor.from_local(t, mesh, placements, run_check=False, shape=weight.shape,
                                  stride=weight.stride())

    if mesh.ndim != 1:
        raise NotImplementedError(f"spectral norm: a weight on a {mesh.ndim}-D mesh ({placements}) "
                                  f"is not supported; the forward sees a weight on the tp mesh alone")
    placement = placements[0]
    if isinstance(placement, Replicate):
        return weight.to_local(), WHOLE, wrap
    if isinstance(placement, Shard) and placement.dim in (0, 1) and weight.dim() == 2:
        # DTensor splits like torch.chunk: ceil(n / ranks) rows or columns a rank, the last may hold
        # fewer (plain arithmetic, no tensors: it also runs under `credit plan`'s fake tensors)
        whole, ranks = weight.shape[placement.dim], mesh.size()
        offset = min(mesh.get_local_rank() * -(-whole // ranks), whole)
        block = Block("rows" if placement.dim == 0 else "cols", offset, mesh.get_group())
        return weight.to_local(), block, wrap
    raise NotImplementedError(f"spectral norm: weight placement {placement} on a {weight.dim()}-D "
                              f"weight is not supported (Shard(0), Shard(1) of a Linear, or Replicate)")


class SpectralNormed:
    """Mixin placed before a layer class (Linear, Conv2d, ConvTranspose2d and their
    deterministic variants): the forward runs the layer's own forward with W / σ."""

    spectral_norm_on_tp_shards = True  # read by credit.parallel.tensor_parallel
    sn_dim: int
    sn_iterations: int
    sn_eps: float
    sn_products: Products
    sn_due: bool
    sn_deferred: dict | None = None  # see defer_spectral_norm_backward

    def _matrix(self, w: torch.Tensor) -> torch.Tensor:
        if self.sn_dim:
            w = w.transpose(0, self.sn_dim)
        return w.reshape(w.shape[0], -1)

    def _unmatrix(self, m: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        if not self.sn_dim:
            return m.reshape(shape)
        swapped = list(shape)
        swapped[0], swapped[self.sn_dim] = swapped[self.sn_dim], swapped[0]
        return m.reshape(swapped).transpose(0, self.sn_dim)

    def sigma(self) -> torch.Tensor:
        """σ = uᵀ W v from the current u, v (a float32 scalar, the same on every rank)."""
        local, block, _ = _block_of(self._parameters["weight"])
        return sigma(self._matrix(local), _local(self.weight_u), _local(self.weight_v), block,
                     self.sn_products)

    def normalized_weight(self, update: bool = False) -> torch.Tensor:
        """W / σ like `weight` (a DTensor when it is one). `update` first advances u, v."""
        weight = self._parameters["weight"]
        local, block, wrap = _block_of(weight)
        matrix = self._matrix(local)
        u, v = _local(self.weight_u), _local(self.weight_v)
        wv = None
        if update:
            wv = power_iterate(matrix, u, v, block, self.sn_products, self.sn_iterations, self.sn_eps)
        deferred = self.sn_deferred if self.training and torch.is_grad_enabled() else None
        return wrap(self._unmatrix(normalized(matrix, u, v, block, self.sn_products, wv, deferred), local.shape))

    def forward(self, *args, **kwargs):
        update = self.training and self.sn_due
        weight = self._parameters["weight"]
        self._parameters["weight"] = self.normalized_weight(update)
        self.sn_due = self.sn_due and not update
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._parameters["weight"] = weight

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, spectral_norm(dim={self.sn_dim}, iterations={self.sn_iterations})"


def _normed_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"SpectralNorm{cls.__name__}", (SpectralNormed, cls), {"__module__": __name__})
    return _CLASSES[cls]


def has_spectral_norm(module: nn.Module) -> bool:
    return isinstance(module, SpectralNormed)


def spectral_normalize(module: nn.Module, *, deterministic: bool, iterations: int = 1,
                       eps: float = 1e-12) -> nn.Module:
    """Normalise `module`'s weight in place (its class becomes a SpectralNormed subclass).

    u and v start as normalised draws from torch's global generator (the same on every
    rank under identical init seeding), then take INIT_ITERATIONS steps on the whole weight.
    """
    if has_spectral_norm(module):
        raise ValueError(f"{type(module).__name__} is already spectral-normalised")
    if not isinstance(module, _LAYERS):
        raise TypeError(f"spectral norm takes Linear, Conv2d or ConvTranspose2d layers, got {type(module).__name__}")
    dim = 1 if isinstance(module, nn.ConvTranspose2d) else 0
    weight = module.weight.detach()
    rows = weight.shape[dim]
    products = Products(deterministic)
    u = products.normalize(torch.randn(rows, device=weight.device), eps)
    v = products.normalize(torch.randn(weight.numel() // rows, device=weight.device), eps)
    module.register_buffer("weight_u", u)
    module.register_buffer("weight_v", v)
    module.__class__ = _normed_class(type(module))
    module.sn_dim, module.sn_iterations, module.sn_eps = dim, iterations, eps
    module.sn_products, module.sn_due = products, False
    if not weight.is_meta:  # a meta model (shapes only, credit/models/gemm_shapes.py) has no values to iterate
        power_iterate(module._matrix(weight), u, v, WHOLE, products, INIT_ITERATIONS, eps)
    return module


def apply_spectral_norm(model: nn.Module, *, deterministic: bool = False) -> nn.Module:
    """Spectral-normalise every Linear, Conv2d and ConvTranspose2d weight of `model`."""
    for module in list(model.modules()):
        if isinstance(module, _LAYERS) and not has_spectral_norm(module):
            spectral_normalize(module, deterministic=deterministic)
    return model


def defer_spectral_norm_backward(model: nn.Module) -> int:
    """Deterministic mode: each normalised layer's backward hands on G = dL/d(W/σ) unchanged,
    so the data-parallel tree (and micro-batch accumulation) sums G, which is linear in the
    samples, and `finish_spectral_norm_gradients` applies the normalisation's backward once,
    to the summed G of the whole step: the same bits at every dp size, as in one process.
    (Applied per rank, the backward is not linear in float32: no split of the batch would be
    bitwise.) Returns the number of normalised layers."""
    layers = [m for m in model.modules() if has_spectral_norm(m)]
    for module in layers:
        if module.sn_deferred is None:
            module.sn_deferred = {}
    return len(layers)


def finish_spectral_norm_gradients(model: nn.Module) -> int:
    """After the gradients are summed over every sample and rank: turn each deferred layer's
    G into dL/dW with the σ, u, v of its training forward, on the whole weight (gathered
    when sharded: the one-process arithmetic), keeping this rank's part. Returns the number
    of gradients finished."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    finished = 0
    for module in model.modules():
        deferred = getattr(module, "sn_deferred", None)
        weight = module._parameters.get("weight") if deferred else None
        if weight is None or weight.grad is None or not deferred:
            continue
        grad = weight.grad
        whole_g = grad.full_tensor() if isinstance(grad, DTensor) else grad
        whole_w = weight.detach().full_tensor() if isinstance(weight, DTensor) else weight.detach()
        matrix = normalization_backward(module._matrix(whole_w), module._matrix(whole_g), _local(deferred["u"]),
                                        _local(deferred["v"]), _local(deferred["s"]), WHOLE, module.sn_products)
        result = module._unmatrix(matrix, whole_w.shape).to(grad.dtype)
        if isinstance(grad, DTensor):
            result = distribute_tensor(result, grad.device_mesh, grad.placements, src_data_rank=None).to_local()
            grad.to_local().copy_(result)
        else:
            grad.copy_(result)
        finished += 1
    return finished


def advance_spectral_norm(model: nn.Module) -> int:
    """Let each normalised layer's next training forward advance u and v (once per
    optimizer step). Returns the number of normalised layers."""
    layers = [m for m in model.modules() if has_spectral_norm(m)]
    for module in layers:
        module.sn_due = True
    return len(layers)
