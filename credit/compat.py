"""The torch APIs that moved between the releases this project supports (2.11 to 2.15).

Every difference between those releases that the code meets is bridged here, once, by what
the installed torch has (never by its version number); the rest of the code calls these names.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather_single(output: torch.Tensor, tensor: torch.Tensor, group: object = None) -> None:
    """Every rank's `tensor` into `output`, in rank order: torch 2.11 has only
    `all_gather_into_tensor`; 2.13 and 2.15 name it `all_gather_single` and keep the old name
    as an alias. Looked up at each call, so what wraps `torch.distributed`'s functions sees
    the call too."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor, group=group)


def fsdp_param_groups(state: object) -> list:
    """FSDP2's parameter groups of one module's state: a list in torch 2.13 and 2.15, a
    single optional group in 2.11."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = state._fsdp_param_group  # torch 2.11; AttributeError if moved again
    return [] if group is None else [group]


def fsdp_gather_dtype(param_group: object, fsdp_param: object) -> torch.dtype | None:
    """The dtype FSDP2 all-gathers one parameter in (None: its own dtype): the mixed-precision
    policy is the parameter's own in torch 2.15, its group's in 2.11 and 2.13."""
    policy = getattr(fsdp_param, "mp_policy", None) or param_group.mp_policy
    return policy.param_dtype
