"""The K tree: schedule, split property of its definition, and the cpu kernel
computing exactly the documented order."""

import pytest
import torch

from credit.kernels.gemm import LEAF, det_mm
from credit.kernels.gemm._tree import merge_schedule, num_leaves, tree_sum


def run_schedule(values, merges):
    stack = []
    for v, m in zip(values, merges):
        stack.append(v)
        for _ in range(m):
            right, left = stack.pop(), stack.pop()
            stack.append(f"({left}+{right})")
    assert len(stack) == 1
    return stack[0]


def expr_tree(values):
    if len(values) == 1:
        return values[0]
    h = (len(values) + 1) // 2
    return f"({expr_tree(values[:h])}+{expr_tree(values[h:])})"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 8, 12, 24, 31, 33, 100])
def test_schedule_evaluates_the_tree(n):
    leaves = [f"l{i}" for i in range(n)]
    merges, depth = merge_schedule(n)
    assert run_schedule(leaves, merges) == expr_tree(leaves)
    # A stack of ceil(log2 n) + 1 partial tiles always suffices.
    assert depth <= (n - 1).bit_length() + 1
    if n & (n - 1) == 0:
        assert depth == (n - 1).bit_length() + 1


@pytest.mark.parametrize("m", [1, 2, 3, 5, 7, 12])
@pytest.mark.parametrize("parts", [2, 4, 8])
def test_tree_of_equal_parts_is_pairwise_sum_of_part_trees(m, parts):
    leaves = [f"l{i}" for i in range(m * parts)]
    chunks = [expr_tree(leaves[i : i + m]) for i in range(0, len(leaves), m)]
    while len(chunks) > 1:
        chunks = [f"({chunks[i]}+{chunks[i + 1]})" for i in range(0, len(chunks), 2)]
    assert expr_tree(leaves) == chunks[0]


def test_num_leaves():
    assert [num_leaves(k) for k in (0, 1, 32, 33, 64, 96, 97)] == [0, 1, 1, 2, 2, 3, 4]
    assert LEAF == 32


def emulate_contract(a: torch.Tensor, b: torch.Tensor, order: str) -> torch.Tensor:
    """fp32 FMA chain per leaf (float64 product + add, rounded once to fp32),
    leaves combined by the K tree ("tree") or left to right ("sequential")."""
    M, K = a.shape
    a64, b64 = a.double(), b.double()
    parts = []
    for lo in range(0, K, LEAF):
        s = torch.zeros(M, b.shape[1], dtype=torch.float32)
        for k in range(lo, min(lo + LEAF, K)):
            s = (s.double() + a64[:, k : k + 1] * b64[k : k + 1, :]).float()
        parts.append(s)
    if order == "tree":
        return tree_sum(parts)
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _operand(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``t`` in another memory layout."""
    if layout == "col":  # column-major, as dW's gradient operand
        return t.t().contiguous().t()
    if layout == "slice":  # a window of a wider row-major matrix, as im2col / split calls
        wide = torch.zeros(t.shape[0], t.shape[1] + 7)
        wide[:, 3 : 3 + t.shape[1]] = t
        return wide[:, 3 : 3 + t.shape[1]]
    return t


# 18 and 41 leaves exceed the kernel's one-pass block (16 leaves): its top levels run as
# separate passes, which must still be exactly the documented tree.
@pytest.mark.parametrize("k", [96, 200, 300, 32 * 17 + 3, 32 * 41])
@pytest.mark.parametrize("layout", ["row", "col", "slice"])
def test_cpu_kernel_computes_exactly_the_documented_order(k, layout):
    g = torch.Generator().manual_seed(40)
    a = torch.randn(13, k, generator=g)
    b = torch.randn(k, 37, generator=g)
    got = det_mm(_operand(a, layout), _operand(b, layout), backend="cpu")
    want = emulate_contract(a, b, "tree")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    # With >= 4 leaves the tree differs from left-to-right leaf order and the
    # emulation tells them apart, so the equality above pins the tree.
    if num_leaves(k) >= 4:
        assert not torch.equal(want, emulate_contract(a, b, "sequential"))


# A narrow N runs as C^T = B^T A^T (tiles the wide M fills): still exactly the documented
# order, with a bias added once to the finished fp32 sums.
@pytest.mark.parametrize("m, k, n", [(200, 40, 5), (300, 32 * 17 + 3, 20), (130, 96, 1)])
@pytest.mark.parametrize("layout", ["row", "col", "slice"])
def test_cpu_kernel_order_holds_for_narrow_outputs(m, k, n, layout):
    from credit.kernels.gemm import _cpu

    g = torch.Generator().manual_seed(41)
    a, b, bias = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(n, generator=g)
    want = emulate_contract(a, b, "tree")
    got = det_mm(_operand(a, layout), _operand(b, layout), backend="cpu")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    with_bias = _cpu.mm(_operand(a, layout), _operand(b, layout), torch.float32, bias)
    assert torch.equal(with_bias.view(torch.int32), (want + bias).view(torch.int32))
    # a bf16 output keeps the bias inside the kernel, before its one rounding
    as_bf16 = _cpu.mm(_operand(a, layout), _operand(b, layout), torch.bfloat16, bias)
    assert torch.equal(as_bf16, (want + bias).to(torch.bfloat16))


@pytest.mark.parametrize("rows, cols", [(1, 5), (45, 37), (32 * 19, 20), (32 * 19 + 9, 20)])
def test_cpu_column_sum_is_the_one_row_gemm(rows, cols):
    """The bias gradient's fast column sum has the bits of ``ones(1, M) @ g`` through the
    kernel (signed zeros included), also on a strided window."""
    from credit.kernels.gemm import _cpu
    from credit.kernels.gemm._registry import kernel

    g = torch.Generator().manual_seed(41)
    wide = torch.randn(rows, cols + 4, generator=g)
    wide[::3, 1] = -0.0
    view = wide[:, 2 : 2 + cols]
    view[:, 0] = -0.0  # all -0: +0 only if each leaf starts from +0 as documented
    want = kernel("cpu")(torch.ones(1, rows), view, torch.float32)[0]
    got = _cpu.colsum(view)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("groups, rows, cols", [(3, 45, 37), (4, 32 * 2, 9), (5, 7, 70), (2, 33, 1)])
def test_cpu_grouped_column_sum_is_the_gemm_over_padded_groups(groups, rows, cols):
    """Row groups (a sample's rows) summed without the padded copy: the bits of
    ``ones @ pad_row_groups(g)`` through the kernel."""
    from credit.kernels.gemm import _cpu
    from credit.kernels.gemm._ops import pad_row_groups
    from credit.kernels.gemm._registry import kernel

    g = torch.randn(groups * rows, cols, generator=torch.Generator().manual_seed(43))
    padded = pad_row_groups(g, groups)
    want = kernel("cpu")(torch.ones(1, padded.shape[0]), padded, torch.float32)[0]
    got = _cpu.colsum(g, groups)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    # the affine weight's gradient: the sum of g * x without the product's temporary
    x = torch.randn(g.shape, generator=torch.Generator().manual_seed(44))
    padded = pad_row_groups(g * x, groups)
    want = kernel("cpu")(torch.ones(1, padded.shape[0]), padded, torch.float32)[0]
    got = _cpu.colsum(g, groups, times=x)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("groups, rows, cols", [(3, 45, 37), (16, 8, 32), (2, 33, 1), (1, 100, 70),
                                                (5, 70, 4), (4, 40, 15)])  # the last two: narrow rows
def test_cpu_affine_gradients_in_one_pass_are_the_three_separate_results(groups, rows, cols):
    """An affine's input, weight and bias gradients from one pass over the rows have the bits
    of ``g * w`` and the two grouped column sums (signed zeros included)."""
    from credit.kernels.gemm import _cpu

    gen = torch.Generator().manual_seed(46)
    g = torch.randn(groups * rows, cols, generator=gen)
    x = torch.randn(g.shape, generator=gen)
    w = torch.randn(cols, generator=gen)
    g[::3, 0] = -0.0
    gx, gw, gb = _cpu.affine_grads(g, x, w, groups)
    assert torch.equal(gx.view(torch.int32), (g * w).view(torch.int32))
    assert torch.equal(gw.view(torch.int32), _cpu.colsum(g, groups, times=x).view(torch.int32))
    assert torch.equal(gb.view(torch.int32), _cpu.colsum(g, groups).view(torch.int32))


@pytest.mark.parametrize("groups, rows, n_out, n_in", [
    (16, 8, 96, 40),     # a coarse stage: 8 tokens a sample, a quarter of each leaf real
    (3, 45, 70, 33),     # groups spanning leaves, ragged tiles
    (16, 8, 300, 32),    # narrow output: the kernel runs the transposed product
    (40, 13, 20, 24),    # 40 leaves: the tree's top levels run as split passes
    (4, 64, 9, 17),      # whole leaves: no padding
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_grouped_weight_gradient_is_the_gemm_over_padded_groups(groups, rows, n_out, n_in,
                                                                    dtype):
    """A weight gradient over samples' rows reduced in groups (``k_groups``) has the bits of
    the GEMM over the zero-padded copies (``pad_row_groups``), signed zeros included, while
    neither forming the copies nor multiplying their padding."""
    from credit.kernels.gemm import _cpu
    from credit.kernels.gemm._ops import pad_row_groups

    gen = torch.Generator().manual_seed(45)
    g = torch.randn(groups * rows, n_out, generator=gen)
    x = torch.randn(groups * rows, n_in, generator=gen)
    g[:, 0] = -0.0  # a column of -0 products: +0 only if the padded leaves match
    g, x = g.to(dtype), x.to(dtype)
    want = _cpu.mm(pad_row_groups(g, groups).t(), pad_row_groups(x, groups), dtype)
    got = _cpu.mm(g.t(), x, dtype, k_groups=groups)
    assert torch.equal(got.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       want.view(torch.int16 if dtype != torch.float32 else torch.int32))
    if rows % 32 and dtype == torch.float32:  # the grouping changes the tree
        # (whole leaves: the same tree; bf16 rounding can hide the difference)
        assert not torch.equal(got, _cpu.mm(g.t(), x, dtype))


def _materialise(base: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    index = row[:, None] + col[None, :]
    valid = (row[:, None] >= 0) & (col[None, :] >= 0)
    return torch.where(valid, base[index.clamp(min=0)], torch.zeros(()))


@pytest.mark.parametrize("k", [40, 32 * 18 + 5])
def test_gather_gemm_is_the_gemm_of_the_matrices_its_tables_address(k):
    """Offset-table operands (with -1 = zero entries, irregular and strided leaves, an output
    scattered into a larger buffer) give the documented order's bits for the matrices they
    address, and leave the rest of the output buffer alone."""
    from credit.kernels.gemm import _cpu

    g = torch.Generator().manual_seed(42)
    m, n = 11, 19
    a_base, b_base = torch.randn(4000, generator=g), torch.randn(24000, generator=g)
    arow = torch.randperm(m, generator=g) * 97
    acol = torch.arange(k) * 3  # strided leaves
    acol[5:9] = torch.randperm(400, generator=g)[:4] + 1200  # an irregular (table) leaf
    acol[-3] = -1
    brow = torch.arange(k) * 40
    brow[7] = -1
    bcol = torch.randperm(n, generator=g) * 2
    out = torch.full((3000,), 7.0)
    orow, ocol = torch.arange(m) * 2 * n, torch.arange(n) * 2  # every other element
    _cpu.mm_gather(a_base, arow, acol, b_base, brow, bcol, out, orow, ocol)
    want = emulate_contract(_materialise(a_base, arow, acol), _materialise(b_base, brow, bcol), "tree")
    got = out[orow[:, None] + ocol[None, :]]
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    untouched = torch.ones(3000, dtype=torch.bool)
    untouched[(orow[:, None] + ocol[None, :]).reshape(-1)] = False
    assert torch.all(out[untouched] == 7.0)


def test_gather_gemm_refuses_tables_past_the_end():
    from credit.kernels.gemm import _cpu

    a, b, out = torch.randn(10), torch.randn(10), torch.zeros(10)
    ok = torch.arange(2)
    with pytest.raises(RuntimeError, match="past the end"):
        _cpu.mm_gather(a, torch.tensor([9, 0]), ok, b, ok, ok, out, ok, ok)
    with pytest.raises(RuntimeError, match="out table entry out of range"):
        _cpu.mm_gather(a, ok, ok, b, ok, ok, out, torch.tensor([-1, 0]), ok)
