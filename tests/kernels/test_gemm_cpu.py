"""The cpu backend against the contract: bitwise invariances and accuracy."""

import pytest
import torch

import gemm_checks as C

BACKEND, DEVICE = "cpu", "cpu"
DTYPES = list(C.DTYPES.values())
IDS = list(C.DTYPES)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_row_alone_vs_batch(dtype):
    C.check_row_invariance(BACKEND, DEVICE, dtype, k=200, n=80, batch_sizes=(1, 64, 512))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_chunked_100_156_vs_256(dtype):
    C.check_chunking(BACKEND, DEVICE, dtype, k=96, n=80, chunks=(100, 156))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_padding_rows(dtype):
    C.check_padding(BACKEND, DEVICE, dtype, m=333, k=96, n=80)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_n_invariance(dtype):
    C.check_n_invariance(BACKEND, DEVICE, dtype, m=37, k=130, n=150)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(("k", "parts"), [(64, 2), (192, 2), (768, 2), (768, 4), (768, 8),
                                          (1024, 8)])
def test_k_split_property(dtype, k, parts):
    C.check_k_split(BACKEND, DEVICE, dtype, m=19, k=k, n=70, parts=parts)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("k", [13 * 32 - 5, 300 * 32])  # a short last leaf; the long-K passes
def test_tree_order(dtype, k):
    C.check_tree_order(BACKEND, DEVICE, dtype, m=21, k=k, n=70)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_grad_row_invariance(dtype):
    C.check_grad_row_invariance(BACKEND, DEVICE, dtype, m=70, k=96, n=80)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_weight_grad_order(dtype):
    C.check_weight_grad_order(BACKEND, DEVICE, dtype, k=48, n=40)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_run_to_run(dtype):
    C.check_run_to_run(BACKEND, DEVICE, dtype, m=333, k=96, n=80)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(333, 96, 80), (1, 1, 1), (5, 1000, 3), (64, 4096, 64),
                                   (7, 31, 65)])
def test_accuracy_vs_float64(dtype, shape):
    C.check_accuracy(BACKEND, DEVICE, dtype, *shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(333, 96, 80), (40, 7, 130)])
def test_backward_vs_float64_autograd(dtype, shape):
    C.check_backward(BACKEND, DEVICE, dtype, *shape)


def test_thread_count_invariance():
    a = C.rand(200, 300, dtype=torch.float32, device=DEVICE, seed=30)
    b = C.rand(300, 140, dtype=torch.float32, device=DEVICE, seed=31)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = C.det_mm(a, b, backend=BACKEND)
        torch.set_num_threads(2)
        two = C.det_mm(a, b, backend=BACKEND)
    finally:
        torch.set_num_threads(old)
    C.same(one, two, "1 vs 2 threads")


def test_strided_inputs_match_contiguous():
    a = C.rand(96, 50, dtype=torch.float32, device=DEVICE, seed=32)
    b = C.rand(80, 96, dtype=torch.float32, device=DEVICE, seed=33)
    # a.t() and b.t() are non-contiguous views; the kernel reads strides.
    C.same(C.det_mm(a.t(), b.t(), backend=BACKEND),
           C.det_mm(a.t().contiguous(), b.t().contiguous(), backend=BACKEND), "strided inputs")


def test_empty_and_zero_k():
    a = torch.ones(0, 5)
    assert C.det_mm(a, torch.ones(5, 3), backend=BACKEND).shape == (0, 3)
    z = C.det_mm(torch.ones(4, 0), torch.ones(0, 3), backend=BACKEND)
    assert z.shape == (4, 3) and bool((z == 0).all())


def test_mkl_is_not_batch_invariant_here_but_det_mm_is():
    """Documents why the cpu backend exists; only det_mm's half is asserted."""
    a = C.rand(8, 512, dtype=torch.float32, device=DEVICE, seed=34)
    b = C.rand(512, 256, dtype=torch.float32, device=DEVICE, seed=35)
    small, big = C.det_mm(a[:2], b, backend=BACKEND), C.det_mm(a, b, backend=BACKEND)
    C.same(small, big[:2], "det_mm rows at M=2 vs M=8")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("k", [32 * 33, 32 * 64 + 7, 32 * 101 + 31])
def test_long_k_in_separate_passes_adds_up_like_its_halves(dtype, k):
    """A K over the kernel's one-pass block runs T(n)'s top levels as separate passes: the
    result is the fp32 sum of the two halves' results (T(ceil(n/2)) + T(floor(n/2))), in every
    input dtype, rounded once to the output dtype."""
    a = C.rand(13, k, dtype=dtype, device=DEVICE, seed=30)
    b = C.rand(k, 40, dtype=dtype, device=DEVICE, seed=31)
    split = (-(-k // 32) + 1) // 2 * 32
    left = C.det_mm(a[:, :split], b[:split], backend=BACKEND, out_dtype=torch.float32)
    right = C.det_mm(a[:, split:], b[split:], backend=BACKEND, out_dtype=torch.float32)
    for out_dtype in {dtype, torch.float32}:
        got = C.det_mm(a, b, backend=BACKEND, out_dtype=out_dtype)
        C.same(got, (left + right).to(out_dtype), f"K={k} as its two halves")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("k", [96, 32 * 20 + 3])  # one pass, and the tree-top split
def test_bias_added_in_the_kernel_is_the_fp32_sum_plus_bias(dtype, k):
    """det_linear adds its bias inside the CPU kernel's store: the same bits as the fp32
    product plus the fp32 bias, rounded once (N not a whole panel)."""
    x = C.rand(13, k, dtype=dtype, device=DEVICE, seed=50)
    w = C.rand(21, k, dtype=dtype, device=DEVICE, seed=51)
    bias = C.rand(21, dtype=dtype, device=DEVICE, seed=52)
    want = (C.det_mm(x, w.t(), backend=BACKEND, out_dtype=torch.float32) + bias.float()).to(dtype)
    C.same(C.det_linear(x, w, bias, backend=BACKEND), want, f"fused bias, K={k}")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("k", [40, 32 * 40 + 3])  # one pass; the tree-top split
@pytest.mark.parametrize("a_transposed", [False, True])  # A read in place; A packed
@pytest.mark.parametrize("n", [32, 17])
def test_narrow_tile_gives_the_wide_tiles_bits(dtype, k, a_transposed, n):
    """Outputs of at most one narrow panel run on the narrow tile (half the columns, more
    rows); its columns equal the same columns computed on the wide tile among 150."""
    from credit.kernels.gemm import _cpu

    if n > _cpu.load().nr // 2:
        pytest.skip("this SIMD level's narrow tile is narrower than n")
    a = C.rand(k, 77, dtype=dtype, device=DEVICE, seed=31).t() if a_transposed else \
        C.rand(77, k, dtype=dtype, device=DEVICE, seed=31)
    b = C.rand(k, 150, dtype=dtype, device=DEVICE, seed=32)
    wide = C.det_mm(a, b, backend=BACKEND, out_dtype=torch.float32)
    C.same(C.det_mm(a, b[:, :n], backend=BACKEND, out_dtype=torch.float32), wide[:, :n], f"N={n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_whole_k_keeps_the_tree_on_the_cpu(dtype):
    """`whole_k` lets the triton backend run one chain; the cpu backend keeps its one order."""
    C.check_whole_k(BACKEND, DEVICE, dtype, m=150, k=333, n=70)
