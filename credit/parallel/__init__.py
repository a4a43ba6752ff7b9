"""Model parallelism: the (dp, tp) mesh, native tensor parallelism, data-parallel wrapping,
mesh-aware gradient clipping and two-stage seeding."""

from credit.parallel.collectives import clip_grad_norm_, sync_replicated_gradients, total_grad_norm
from credit.parallel.mesh import (
    DATA_MODES,
    ParallelLayout,
    build_device_mesh,
    init_distributed,
    launched_world_size,
    resolve_layout,
)
from credit.parallel.seeding import seed_for_init, seed_for_runtime
from credit.parallel.tensor_parallel import apply_native_tensor_parallel, supports_native_tp
from credit.parallel.wrap import parallelize_model, shard_units

__all__ = [
    "DATA_MODES",
    "ParallelLayout",
    "apply_native_tensor_parallel",
    "build_device_mesh",
    "clip_grad_norm_",
    "init_distributed",
    "launched_world_size",
    "parallelize_model",
    "resolve_layout",
    "seed_for_init",
    "seed_for_runtime",
    "shard_units",
    "supports_native_tp",
    "sync_replicated_gradients",
    "total_grad_norm",
]
