"""Native DTensor tensor parallelism driven by the `_tp_plan` each block declares.

A block opts in with `_tp_plan = {"submodule.path": "colwise" | "rowwise"}` and may add
`_tp_constraints(module, tp_size)` raising a clear error. This module never knows model
class names: it walks the modules, checks every planned path, and hands the plan to
`parallelize_module` with torch's `ColwiseParallel` / `RowwiseParallel`.
"""

from __future__ import annotations

import logging

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from credit.config.validate_model import deterministic_split_error
from credit.kernels.gemm._tree import LEAF
from credit.parallel.sequence import ROW_DIM

log = logging.getLogger(__name__)

_STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def planned_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every submodule that declares a non-empty `_tp_plan`."""
    return [(n, m) for n, m in model.named_modules() if getattr(m, "_tp_plan", None)]


def supports_native_tp(model: nn.Module) -> bool:
    """True when at least one submodule opts in with a `_tp_plan`."""
    return bool(planned_blocks(model))


def _has_spectral_norm(layer: nn.Module) -> bool:
    # credit's spectral norm (credit.models.spectral_norm) marks its layers; no import of
    # the models floor from here
    return getattr(layer, "spectral_norm_on_tp_shards", False) or _has_foreign_spectral_norm(layer)


def _has_foreign_spectral_norm(layer: nn.Module) -> bool:
    # torch's own spectral norms need the whole weight: hook style keeps `weight_orig`, the
    # parametrization a `parametrizations` dict
    return hasattr(layer, "weight_orig") or "weight" in getattr(layer, "parametrizations", {})


def _unaligned_split(name: str, block: nn.Module, tp_size: int) -> str | None:
    """Why the block cannot be split over `tp_size` ranks with bits equal to one process's
    (None when it can): a planned layer declaring `tp_split_multiple` (the deterministic
    GEMM's leaf) whose split width gives a rank a part that is not a whole number of them."""
    for path, style in block._tp_plan.items():
        layer = block.get_submodule(path) if _has_path(block, path) else None
        if getattr(layer, "tp_split_multiple", 1) == 1:
            continue
        width = layer.out_features if style == "colwise" else layer.in_features
        where = f"{name}.{path}" if name else path
        if deterministic_split_error(where, "width", width, tp_size):
            return f"{where}: {width} wide, {width / tp_size:g} per rank"
    return None


def _check_block(name: str, block: nn.Module, tp_size: int) -> None:
    for path, style in block._tp_plan.items():
        where = f"{name}.{path}" if name else path
        if style not in _STYLES:
            raise ValueError(f"{type(block).__name__}._tp_plan[{path!r}]={style!r} is not one of {list(_STYLES)}")
        try:
            layer = block.get_submodule(path)
        except AttributeError:
            raise ValueError(f"_tp_plan of {type(block).__name__} names {where!r}, which does not exist") from None
        if not isinstance(layer, nn.Linear):
            raise ValueError(
                f"_tp_plan entry {where!r} is a {type(layer).__name__}; only nn.Linear layers can be "
                f"tensor-parallel"
            )
        split, what = (
            (layer.out_features, "out_features") if style == "colwise" else (layer.in_features, "in_features")
        )
        if split % tp_size:
            raise ValueError(
                f"{where} ({style}) has {what}={split}, not divisible by "
                f"trainer.parallelism.tensor={tp_size}"
            )
    constraints = getattr(block, "_tp_constraints", None)
    if constraints is not None:
        constraints(block, tp_size)


def _in_stage(name: str, stages: tuple[str, ...] | list[str]) -> bool:
    return any(name == stage or name.startswith(stage + ".") for stage in stages)


def _style(style: str, sequence: bool):
    # under sequence parallelism a rowwise layer reduce-scatters its partial sums to this
    # rank's rows instead of all-reducing them; a colwise layer's input is gathered by its block
    if style == "rowwise" and sequence:
        return RowwiseParallel(output_layouts=Shard(ROW_DIM))
    return _STYLES[style]()


def apply_native_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, spectral_norm: str = "shard",
                                 sequence_stages: tuple[str, ...] | list[str] = ()) -> int:
    """Shard every opted-in block over `tp_mesh`; return how many blocks were sharded.

    Planned Linear weights become DTensors (colwise: Shard(0) of the weight, output sharded
    on the last dim; rowwise: Shard(1), partial outputs all-reduced to a replicated result),
    keeping their names and logical shapes, so checkpoints and optimizers see one model.
    Spectral-normed layers (`credit.models.spectral_norm`) shard too: their power iteration
    runs on the shards. `spectral_norm="replicate"` (`model.spectral_norm_tp`) leaves blocks
    with spectral-normed planned layers replicated on every tp rank, as do torch's own
    spectral norms, which need the whole weight; the whole colwise/rowwise group is skipped
    together because a colwise output is only valid feeding its rowwise partner. A block of
    deterministic layers whose split would give a rank a part of a width that is not whole
    GEMM leaves stays replicated too, so it computes exactly what one process computes.
    Raises ValueError when a plan is invalid, or when nothing can be sharded at tp > 1 for
    any reason but `spectral_norm="replicate"`. Blocks under `sequence_stages` (module names
    chosen by `credit.parallel.sequence.apply_sequence_parallel`) get row-sharded rowwise outputs.
    """
    tp_size = tp_mesh.size()
    blocks = planned_blocks(model)
    if tp_size > 1 and not blocks:
        raise ValueError(
            f"trainer.parallelism.tensor={tp_size} but {type(model).__name__} declares no _tp_plan "
            f"on any block; use tensor=1"
        )
    sharded, replicated, foreign, unaligned = 0, 0, 0, []
    for name, block in blocks:
        layers = [block.get_submodule(p) for p in block._tp_plan if _has_path(block, p)]
        if any(_has_foreign_spectral_norm(layer) for layer in layers):
            foreign += 1
            continue
        if spectral_norm == "replicate" and any(_has_spectral_norm(layer) for layer in layers):
            replicated += 1
            continue
        problem = _unaligned_split(name, block, tp_size)
        if problem:
            unaligned.append(problem)
            continue
        _check_block(name, block, tp_size)
        sequence = _in_stage(name, sequence_stages)
        plan = {path: _style(style, sequence) for path, style in block._tp_plan.items()}
        for parallel_style in plan.values():
            # every rank holds the same full weights (seeding stage 1, or the same checkpoint),
            # so each takes its own shard: no scatter from rank 0 per weight (~2.5 s of a
            # 4-rank CPU start)
            parallel_style.src_data_rank = None
        parallelize_module(block, tp_mesh, plan)
        sharded += 1
    if foreign:
        log.warning("tensor parallel: %d of %d blocks use torch's spectral norm (hook or "
                    "parametrization) and stay replicated on every tp rank", foreign, len(blocks))
    if replicated:
        log.warning("tensor parallel (model.spectral_norm_tp=replicate): %d blocks sharded, %d "
                    "spectral-normed blocks replicated on every tp rank", sharded, replicated)
    if unaligned:
        # expected of narrow blocks, and alike on every rank: rank 0 says it
        log.info("tensor parallel (model.gemm=deterministic): %d blocks kept whole on every tp rank, "
                 "their widths not giving each rank whole %d-wide GEMM leaves (first: %s)",
                 len(unaligned), LEAF, unaligned[0])
    if tp_size > 1 and sharded == 0:
        if foreign or (spectral_norm != "replicate" and not unaligned):
            raise ValueError(
                f"trainer.parallelism.tensor={tp_size} but every planned block uses torch's "
                f"spectral norm, so nothing can be sharded; build the model with "
                f"credit.models.apply_spectral_norm or use tensor=1"
            )
        log.warning("tensor parallelism has no effect: every planned block is replicated; each "
                    "tp rank repeats the whole computation")
    log.info("applied tensor parallel (tp=%d) to %d blocks", tp_size, sharded)
    return sharded


def _has_path(block: nn.Module, path: str) -> bool:
    try:
        block.get_submodule(path)
    except AttributeError:
        return False
    return True
