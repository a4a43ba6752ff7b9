"""The CPU extensions' SIMD builds give the same bits (docs/kernels.md): two deterministic
steps of CREDIT's models (forward, backward, the exact gradient norm, AdamW) and the GEMM at
shapes whose tiling differs by build (edge tiles, the narrow path, 33 leaves, one row, a
bias, bfloat16, the backward) are computed with this CPU's build and again with the scalar
one (`CREDIT_GEMM_CPU_ISA=scalar`), and compared bit for bit. A cluster whose nodes differ in
vector width (AVX-512 and AVX2 nodes, a job resumed on the other kind) trains the same run.

Each machine compares its own build with the scalar one, which every x86 CPU runs: an
AVX-512 machine checks avx512 = scalar, an AVX2 machine avx2 = scalar, so the suite on both
kinds (CI runs on either) covers every pair without a third build here."""

from __future__ import annotations

import pytest
import torch

from credit.kernels.gemm import det_linear, det_mm
from credit.kernels.gemm._cpu import ISA_ENV, _detected_isa
from credit.models.credit.config import build_credit_model, resolve_credit_model
from credit.parallel.exact_norm import exact_grad_norm
from credit.train.elementwise_adamw import ElementwiseAdamW

GRID = (16, 32)
MODEL = dict(image_height=GRID[0], image_width=GRID[1], frames=2, channels=2, levels=2, surface_channels=1,
             input_only_channels=2, output_only_channels=1, dim=[8, 16, 32, 64], depth=[1, 1, 1, 1],
             dim_head=4, local_window_size=[2, 2, 2, 1], global_window_size=[2, 2, 1, 1],
             cross_embed_kernel_sizes=[[2, 4]] * 4, cross_embed_strides=[2, 2, 2, 2],
             attn_dropout=0.0, ff_dropout=0.0, use_spectral_norm=False)
KINDS = {  # the convolutions and group norms of the one, the column attention and layer norms of the other
    "wxformer": dict(type="wxformer"),
    "nextgen_wxformer": dict(type="nextgen_wxformer", col_attn_heads=2, num_spectral_nodes=8,
                             decoder_col_attn=True),
}
IN_CHANNELS = 2 * 2 + 1 + 2
NATIVE = _detected_isa()


def _model_step(kind: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = build_credit_model(*resolve_credit_model({**MODEL, **KINDS[kind]}), "deterministic")
    i = torch.arange(3 * IN_CHANNELS * 2 * GRID[0] * GRID[1], dtype=torch.float64)
    x = torch.sin(i * 0.113).view(3, IN_CHANNELS, 2, *GRID).float()
    optimizer = ElementwiseAdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    out = {}
    for step in range(2):
        optimizer.zero_grad()
        y = net(x)
        (y.square().mean() + y.mean()).backward()
        out[f"forecast {step}"] = y.detach().clone()
        out[f"grad norm {step}"] = exact_grad_norm(p.grad for p in net.parameters())
        out.update({f"grad {name} {step}": p.grad.clone() for name, p in net.named_parameters()})
        optimizer.step()
    out.update({f"param {name}": p.detach().clone() for name, p in net.named_parameters()})
    return out


def _gemms() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = {}
    # M, K, N: an edge tile in every direction, N on the narrow path, K of 33 leaves, one row
    for m, k, n in [(37, 1000, 150), (70, 96, 12), (1, 1056, 80), (200, 64, 64)]:
        a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        out[f"mm {m}x{k}x{n}"] = det_mm(a, b, backend="cpu")
        out[f"mm bf16 {m}x{k}x{n}"] = det_mm(a.bfloat16(), b.bfloat16(), backend="cpu")
        x = a.clone().requires_grad_()
        weight = b.t().contiguous().requires_grad_()
        bias = torch.randn(n, generator=g).requires_grad_()
        y = det_linear(x, weight, bias, backend="cpu")
        y.backward(torch.randn(m, n, generator=g))
        out.update({f"linear {m}x{k}x{n}": y.detach(), f"dx {m}x{k}x{n}": x.grad,
                    f"dw {m}x{k}x{n}": weight.grad, f"db {m}x{k}x{n}": bias.grad})
    return out


def _under(isa: str | None, monkeypatch, compute) -> dict[str, torch.Tensor]:
    if isa is None:
        monkeypatch.delenv(ISA_ENV, raising=False)
    else:
        monkeypatch.setenv(ISA_ENV, isa)
    return compute()


def _same_bits(native: dict[str, torch.Tensor], other: dict[str, torch.Tensor], isa: str) -> None:
    assert native.keys() == other.keys()
    differ = [key for key in native if not torch.equal(native[key], other[key])]
    assert not differ, f"{isa} differs from {NATIVE} in {len(differ)} of {len(native)}: {differ[:5]}"


pytestmark = pytest.mark.skipif(NATIVE == "scalar", reason="a CPU without AVX2 has the scalar build only")


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_simd_and_scalar_builds_step_credits_models_with_the_same_bits(kind, monkeypatch):
    native = _under(None, monkeypatch, lambda: _model_step(kind))
    _same_bits(native, _under("scalar", monkeypatch, lambda: _model_step(kind)), "scalar")


def test_the_simd_and_scalar_builds_give_the_gemms_bits(monkeypatch):
    native = _under(None, monkeypatch, _gemms)
    _same_bits(native, _under("scalar", monkeypatch, _gemms), "scalar")
