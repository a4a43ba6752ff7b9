"""The fixed reduction tree over the K dimension, shared by every backend.

K is cut into leaves of ``LEAF`` consecutive elements (the last leaf may be
shorter; it is zero-padded, which leaves sums unchanged).  Inside a leaf the
products are accumulated sequentially in fp32 starting from zero.  Leaves are
combined by a binary tree that depends only on the number of leaves ``n``::

    T(1)  = the leaf itself
    T(n)  = T(ceil(n/2)) + T(floor(n/2))     (left part first, then right)

Splitting at ``ceil(n/2)`` means that whenever ``n`` is even the two halves are
the same tree ``T(n/2)``; applied twice / three times, a K that splits into 2, 4
or 8 equal leaf-aligned parts is exactly the pairwise sum of the trees of the
parts.  That is what makes tensor-parallel partial sums reproduce the
unsharded result bitwise (for P = 2, 4, 8 parts added pairwise).

Kernels evaluate the tree left to right with a small stack of partial tiles:
after leaf ``i`` they push its sum and then perform ``merges[i]`` additions,
each popping the two top entries (left below, right on top) and pushing
``left + right``.  ``merges`` is the post-order schedule of ``T(n)``.
"""

from __future__ import annotations

import functools

import torch

LEAF = 32
"""Number of consecutive K elements accumulated sequentially in one leaf."""


def left_leaves(n: int) -> int:
    """Leaves in the left subtree of the tree over ``n``: T(n) = T(ceil(n/2)) + T(floor(n/2)),
    the one split rule every kernel, host recursion and slab follows."""
    return (n + 1) // 2


def num_leaves(k: int) -> int:
    """Number of leaves for a reduction of length ``k`` (0 for ``k == 0``)."""
    return -(-k // LEAF)


@functools.lru_cache(maxsize=256)
def merge_schedule(n: int) -> tuple[tuple[int, ...], int]:
    """Return ``(merges, depth)`` for the tree over ``n`` leaves.

    ``merges[i]`` is the number of additions performed right after leaf ``i``
    is pushed; ``depth`` is the largest number of partial tiles ever held on
    the stack (kernels size their scratch from it).
    """
    if n < 1:
        raise ValueError(f"the K tree needs at least one leaf, got n={n}")
    merges = [0] * n

    # Iterative post-order walk (explicit stack: n can be large).
    todo = [(0, n)]
    while todo:
        lo, cnt = todo.pop()
        if cnt == 1:
            continue
        left = left_leaves(cnt)
        # This node's addition happens after its right subtree's last leaf.
        merges[lo + cnt - 1] += 1
        todo.append((lo + left, cnt - left))
        todo.append((lo, left))

    depth = live = 0
    for m in merges:
        live += 1
        depth = max(depth, live)
        live -= m
    if live != 1:  # the schedule must end with exactly the root on the stack
        raise AssertionError(f"invalid merge schedule for n={n}")
    return tuple(merges), depth


_SCHEDULE_TENSORS: dict[tuple[int, str], torch.Tensor] = {}


def schedule_tensor(n: int, device: torch.device) -> torch.Tensor:
    """``merges`` for ``n`` leaves as an int32 tensor on ``device`` (cached)."""
    key = (n, str(device))
    t = _SCHEDULE_TENSORS.get(key)
    if t is None:
        t = torch.tensor(merge_schedule(n)[0], dtype=torch.int32, device=device)
        _SCHEDULE_TENSORS[key] = t
    return t


def tree_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Add per-leaf partial sums with ``T(len(parts))`` (reference / tests)."""
    n = len(parts)
    if n == 1:
        return parts[0]
    left = left_leaves(n)
    return tree_sum(parts[:left]) + tree_sum(parts[left:])
