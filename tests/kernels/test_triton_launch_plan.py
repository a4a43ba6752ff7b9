"""How the triton launcher splits the K tree: the levels it runs as separate subtrees.

The bits never depend on the split (test_gemm_triton_interpret.py checks that); these
pin the plan itself, which decides whether a long-K weight gradient uses the GPU's SMs.
"""

import pytest

from credit.kernels.gemm._triton import split_levels, tree_depth

H100_PROGRAMS = 2 * 132  # two 64 x 64 tiles per SM


@pytest.mark.parametrize("n, tiles, limits, levels", [
    (4, 5000 * 2, (7, 7), 0),      # a forward: K = 128, thousands of tiles
    (256, 5 * 1, (7, 7), 5),       # dW 32 x 288 over 8192 rows: 32 subtrees of 8 leaves
    (10000, 4, (7, 6), 8),         # dW 128 x 128 over 320000 rows: the registers want 8
    (512, 4096, (7, 7), 2),        # a tall tree over many tiles: split for the registers only
    (300, 1, (8, 8), 5),           # one tile: split down to subtrees of at least 8 leaves
    (15, 1, (8, 8), 0),            # too few leaves to split
])
def test_split_levels(n, tiles, limits, levels):
    got = split_levels(n, tiles, limits, H100_PROGRAMS)
    assert got == levels
    tallest = -(-n // (1 << got))
    assert tree_depth(tallest) <= (limits[1] if got else limits[0])
    if got:  # every node above the split level has two children
        assert n >> (got - 1) >= 2
