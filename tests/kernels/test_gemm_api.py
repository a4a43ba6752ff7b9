"""Public API: validation errors, backend registry, DetLinear drop-in."""

import pytest
import torch
from torch import nn

import gemm_checks as C
from credit.kernels.gemm import (
    BackendUnavailableError,
    DetLinear,
    available_backends,
    det_linear,
    det_mm,
)
from credit.kernels.gemm._registry import resolve


def ab(m=4, k=8, n=5, dtype=torch.float32):
    return C.rand(m, k, dtype=dtype, device="cpu", seed=50), C.rand(k, n, dtype=dtype, device="cpu", seed=51)


# --- registry ---------------------------------------------------------------

def test_available_backends_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert available_backends("cpu") == ["cpu", "reference"]
    assert available_backends(torch.device("cpu")) == ["cpu", "reference"]


def test_auto_picks_cpu_never_reference():
    assert resolve("auto", "cpu") == "cpu"


@pytest.mark.parametrize("name", ["cpuu", "CPU", "", "torch", None, 3])
def test_unknown_backend_lists_choices(name):
    a, b = ab()
    with pytest.raises(ValueError, match=r"unknown gemm backend .*available on cpu: \['cpu', 'reference'\]"):
        det_mm(a, b, backend=name)


@pytest.mark.parametrize("name", ["cuda", "triton"])
def test_gpu_backend_on_cpu_tensors_raises(name, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    a, b = ab()
    with pytest.raises(BackendUnavailableError, match=rf"'{name}' is not available on cpu: .*available: \['cpu', 'reference'\]"):
        det_mm(a, b, backend=name)


def test_cpu_backend_rejects_other_devices():
    a = torch.empty(4, 8, device="meta")
    b = torch.empty(8, 5, device="meta")
    with pytest.raises(BackendUnavailableError, match="cpu backend runs on CPU tensors only"):
        det_mm(a, b, backend="cpu")
    with pytest.raises(BackendUnavailableError, match="no deterministic gemm backend for device meta"):
        det_mm(a, b)


def test_reference_backend_is_matmul():
    a, b = ab(33, 70, 20)
    torch.testing.assert_close(det_mm(a, b, backend="reference"), a @ b)


# --- validation -------------------------------------------------------------

def test_inner_dimension_mismatch():
    a, _ = ab(4, 8)
    with pytest.raises(ValueError, match=r"inner dimensions differ: a is \(4, 8\), b is \(7, 5\)"):
        det_mm(a, torch.ones(7, 5))


@pytest.mark.parametrize("shapes", [((4,), (4, 5)), ((2, 4, 8), (8, 5)), ((4, 8), (8,))])
def test_wrong_ndim(shapes):
    with pytest.raises(ValueError, match="expects 2-D"):
        det_mm(torch.ones(shapes[0]), torch.ones(shapes[1]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.complex64])
def test_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match=r"dtype .*supported: \['torch.float32', 'torch.bfloat16', 'torch.float16'\]"):
        det_mm(torch.ones(4, 8, dtype=dtype), torch.ones(8, 5, dtype=dtype))


def test_mixed_dtypes():
    a, b = ab()
    with pytest.raises(TypeError, match="must share a dtype"):
        det_mm(a, b.bfloat16())


def test_device_mismatch():
    a, _ = ab()
    with pytest.raises(ValueError, match="same device, got cpu and meta"):
        det_mm(a, torch.empty(8, 5, device="meta"))
    with pytest.raises(ValueError, match="same device"):
        det_linear(a, torch.empty(5, 8, device="meta"))


def test_bad_out_dtype():
    a, b = ab(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype=torch.float16"):
        det_mm(a, b, out_dtype=torch.float16)
    assert det_mm(a, b, out_dtype=torch.float32).dtype == torch.float32


def test_not_a_tensor():
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        det_mm([[1.0]], torch.ones(1, 1))


def test_det_linear_validation():
    x = torch.ones(2, 3, 8)
    with pytest.raises(ValueError, match=r"last dimension 8 does not match weight \(N, K\) = \(5, 7\)"):
        det_linear(x, torch.ones(5, 7))
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        det_linear(x, torch.ones(5, 8), torch.ones(4))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        det_linear(x, torch.ones(5, 8, 1))
    with pytest.raises(TypeError, match="must share a dtype"):
        det_linear(x, torch.ones(5, 8), torch.ones(5, dtype=torch.float16))


# --- det_linear / DetLinear -------------------------------------------------

@pytest.mark.parametrize("dtype", list(C.DTYPES.values()), ids=list(C.DTYPES))
def test_det_linear_matches_f_linear(dtype):
    x = C.rand(3, 50, 96, dtype=dtype, device="cpu", seed=52)
    w = C.rand(40, 96, dtype=dtype, device="cpu", seed=53)
    bias = C.rand(40, dtype=dtype, device="cpu", seed=54)
    y = det_linear(x, w, bias)
    assert y.shape == (3, 50, 40) and y.dtype == dtype
    exact = x.double() @ w.double().t() + bias.double()
    # The bias is one more fp32 addition: the bound of the (K+1)-term sum with
    # a column of ones in x and |bias| as an extra row of w^T.
    x_aug = torch.cat([x.reshape(-1, 96).abs(), torch.ones(150, 1, dtype=dtype)], dim=1)
    w_aug = torch.cat([w.abs().t(), bias.abs()[None, :]], dim=0)
    bound = C.error_bound(x_aug, w_aug, 96, dtype, extra_terms=1)
    assert float(((y.double() - exact).reshape(-1, 40).abs() - bound).max()) <= 0


def test_det_linear_3d_rows_are_batch_invariant():
    x = C.rand(4, 30, 64, dtype=torch.float32, device="cpu", seed=55)
    w = C.rand(48, 64, dtype=torch.float32, device="cpu", seed=56)
    bias = C.rand(48, dtype=torch.float32, device="cpu", seed=57)
    full = det_linear(x, w, bias)
    C.same(det_linear(x[2:3, 7:8], w, bias)[0, 0], full[2, 7], "token alone vs in (4, 30) batch")


def test_detlinear_state_dict_and_drop_in():
    torch.manual_seed(0)
    ref = nn.Linear(96, 40)
    det = DetLinear(96, 40)
    assert list(det.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    det.load_state_dict(ref.state_dict())
    ref.load_state_dict(det.state_dict())
    x = C.rand(33, 96, dtype=torch.float32, device="cpu", seed=58)
    torch.testing.assert_close(det(x), ref(x))
    assert isinstance(det, nn.Linear) and "backend='auto'" in repr(det)


def test_detlinear_without_bias_and_grads():
    torch.manual_seed(0)
    ref = nn.Linear(64, 24, bias=False)
    det = DetLinear(64, 24, bias=False)
    assert det.bias is None and list(det.state_dict()) == ["weight"]
    det.load_state_dict(ref.state_dict())
    x = C.rand(10, 64, dtype=torch.float32, device="cpu", seed=59)
    xr, xd = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref(xr).square().sum().backward()
    det(xd).square().sum().backward()
    torch.testing.assert_close(xd.grad, xr.grad)
    torch.testing.assert_close(det.weight.grad, ref.weight.grad)


def test_detlinear_bias_grad_and_from_linear():
    torch.manual_seed(0)
    ref = nn.Linear(64, 24)
    det = DetLinear.from_linear(ref)
    assert det.weight is ref.weight and det.bias is ref.bias
    x = C.rand(70, 64, dtype=torch.float32, device="cpu", seed=60)
    g = C.rand(70, 24, dtype=torch.float32, device="cpu", seed=61)
    det(x).backward(g)
    got = (ref.weight.grad.clone(), ref.bias.grad.clone())
    ref.zero_grad()
    torch.nn.functional.linear(x, ref.weight, ref.bias).backward(g)
    torch.testing.assert_close(got[0], ref.weight.grad)
    torch.testing.assert_close(got[1], ref.bias.grad)


def test_detlinear_backend_is_honoured():
    det = DetLinear(8, 4, backend="cuda")
    with pytest.raises(BackendUnavailableError, match="'cuda' is not available on cpu"):
        det(torch.ones(2, 8))
