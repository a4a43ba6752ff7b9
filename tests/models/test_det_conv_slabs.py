"""The deterministic convolution a slab at a time (`credit.models.deterministic.slabs`, the
GPU path for convolutions whose im2col matrix is large) is bitwise the matrix definition:
output, input gradient (folded, or a convolution of g for stride 1), weight gradient (its
row tree split at the tree's own nodes) and bias gradient, with slabs of one output row up
to all of them; and it keeps only the input and the weight for backward."""

import pytest
import torch

from credit.models.deterministic.layers import ConvGeometry, DetConv2d, _adjoint, _matrix_conv2d
from credit.models.deterministic.slabs import SLAB_BYTES, fits, slab_conv2d
from credit.models.deterministic import conv as det_conv


def _run(conv, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, upstream_seed: int):
    xi, wi = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    bi = None if bias is None else bias.clone().requires_grad_(True)
    y = conv(xi, wi, bi)
    upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(upstream_seed))
    y.backward(upstream)
    return y.detach(), xi.grad, wi.grad, None if bi is None else bi.grad


def _same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, what
    assert torch.equal(a.view(torch.int32), b.view(torch.int32)), f"{what} differs"


@pytest.mark.parametrize(
    "c_in, c_out, kernel, stride, padding, grid, batch",
    [
        (3, 4, 8, 2, 3, (20, 24), 2),   # a cross-embedding: overlapping strided patches, folded dx
        (5, 6, 4, 2, 1, (13, 18), 3),   # odd rows; 63 positions a sample: padded leaves
        (4, 5, 3, 1, 1, (9, 13), 2),    # stride 1: dx the convolution of g
        (6, 3, 5, 1, 2, (7, 11), 1),    # 5 x 5, one sample
        (2, 3, 2, 2, 0, (10, 14), 2),   # disjoint patches
        (6, 8, 2, 3, 0, (9, 11), 2),    # rows between patches: a zero gradient
    ],
)
@pytest.mark.parametrize("slab_bytes", [1, 3000, 40000, SLAB_BYTES])  # one row per slab .. all
def test_slabs_are_the_matrix_path_bitwise(c_in, c_out, kernel, stride, padding, grid, batch, slab_bytes):
    torch.manual_seed(0)
    layer = DetConv2d(c_in, c_out, kernel, stride=stride, padding=padding)
    x = torch.randn(batch, c_in, *grid)
    geometry = ConvGeometry(layer.kernel_size, layer.stride, layer.padding, layer.dilation)
    adjoint = _adjoint(geometry) if det_conv.input_grad_is_a_convolution(geometry) else None
    definition = _run(lambda a, w, b: _matrix_conv2d(a, w, b, geometry), x, layer.weight.detach(),
                      layer.bias.detach(), upstream_seed=5)
    slabs = _run(lambda a, w, b: slab_conv2d(a, w, b, geometry, adjoint, budget=slab_bytes), x,
                 layer.weight.detach(), layer.bias.detach(), upstream_seed=5)
    for what, a, b in zip(("output", "dx", "dW", "db"), definition, slabs):
        _same_bits(a, b, what)


def test_only_the_input_and_weight_are_kept_for_backward():
    """The memory bound: autograd holds x and W, not the im2col rows nor their gradient."""
    geometry = ConvGeometry((8, 8), (2, 2), (3, 3), (1, 1))
    x = torch.randn(1, 3, 32, 32, requires_grad=True)
    weight = torch.randn(4, 3, 8, 8, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        slab_conv2d(x, weight, None, geometry, None, budget=4096)
    assert sum(saved) == x.numel() * 4 + weight.numel() * 4
    # the definition keeps its 16 x 16 x 192 im2col rows
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _matrix_conv2d(x, weight, None, geometry)
    assert max(saved) >= 16 * 16 * 192 * 4


def test_a_large_convolution_takes_the_slab_path():
    """CREDIT's 1-degree cross-embedding: its 10.6 GB im2col matrix is over the budget."""
    geometry = ConvGeometry((32, 32), (2, 2), (15, 15), (1, 1))
    x = torch.empty(1, 79, 256, 512, device="meta")
    weight = torch.empty(4, 79, 32, 32, device="meta")
    assert not fits(x, weight, geometry)
    assert fits(torch.empty(1, 79, 16, 16, device="meta"), weight, geometry)


def test_a_tall_kernel_folds_its_input_gradient_in_columns_too():
    """A 16 x 16 kernel at stride 2 on a wide grid: a slab one patch high needs the patch
    gradients of every output row that reaches it, across the grid (1.7 MB), over the budget;
    its columns are then slabbed as well, so no patch-gradient block passes the budget, with
    the definition's bits."""
    from credit.models.deterministic import slabs as slab_module

    geometry = ConvGeometry((16, 16), (2, 2), (7, 7), (1, 1))
    x = torch.randn(1, 3, 20, 120)
    weight = torch.randn(4, 3, 16, 16) * 0.1
    bias = torch.randn(4)
    budget = 1_000_000  # bytes; one output row's patches (57 positions x 768 x 4 bytes): 175 KB
    blocks = []
    real_mm = slab_module._mm

    def recording_mm(a, b, backend, out_dtype, whole=False):
        out = real_mm(a, b, backend, out_dtype, whole)
        if whole and b.shape[0] == weight.shape[0]:  # patch gradients: rows @ W over C_out
            blocks.append(out.numel() * out.element_size())
        return out

    definition = _run(lambda a, w, b: _matrix_conv2d(a, w, b, geometry), x, weight, bias, upstream_seed=3)
    slab_module._mm = recording_mm
    try:
        sliced = _run(lambda a, w, b: slab_conv2d(a, w, b, geometry, None, budget=budget), x, weight, bias,
                      upstream_seed=3)
    finally:
        slab_module._mm = real_mm
    for what, a, b in zip(("output", "dx", "dW", "db"), definition, sliced):
        _same_bits(a, b, what)
    assert len(blocks) > 1 and max(blocks) <= budget, blocks


@pytest.mark.parametrize("path", ["definition", "slabs"])
def test_the_input_gradient_holds_a_storage_of_its_own_size(path):
    """A folded input gradient is made in a tensor of x's size: col2im makes its output like
    its columns and then shrinks it, so a gradient taken straight from F.fold would keep an
    im2col matrix's storage alive (1.2 GB for CREDIT's 1-degree cross-embedding) for as long
    as autograd holds it."""
    geometry = ConvGeometry((8, 8), (2, 2), (3, 3), (1, 1))
    x = torch.randn(2, 3, 24, 32, requires_grad=True)
    weight = torch.randn(4, 3, 8, 8, requires_grad=True)
    if path == "definition":
        y = _matrix_conv2d(x, weight, None, geometry)
    else:
        y = slab_conv2d(x, weight, None, geometry, None, budget=4096)
    y.backward(torch.ones_like(y))
    assert x.grad.untyped_storage().nbytes() == x.numel() * x.element_size()


def test_fold_is_f_fold_bitwise_in_a_tensor_of_its_own_size():
    from torch.nn import functional as F

    from credit.models.deterministic.slabs import fold

    cols = torch.randn(2, 5 * 4 * 3, 10 * 11)  # (20 + 2 - 4) // 2 + 1 rows, (11 + 4 - 5) + 1 columns
    args = dict(kernel_size=(4, 3), dilation=(1, 2), padding=(1, 2), stride=(2, 1))
    ours = fold(cols, (20, 11), args["kernel_size"], args["dilation"], args["padding"], args["stride"])
    _same_bits(ours, F.fold(cols, (20, 11), **args), "fold")
    assert ours.untyped_storage().nbytes() == ours.numel() * ours.element_size()
    # a GEMM's output, transposed (not contiguous): folded a few channels at a time
    transposed = cols.transpose(1, 2).contiguous().transpose(1, 2)
    for chunk_bytes in (1, 3 * 12 * 110 * 2 * 4, 1 << 30):  # a channel, 3 channels, all at once
        chunked = fold(transposed, (20, 11), args["kernel_size"], args["dilation"], args["padding"],
                       args["stride"], chunk_bytes=chunk_bytes)
        _same_bits(chunked, ours, f"fold in chunks of {chunk_bytes} bytes")
