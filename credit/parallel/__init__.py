"""Model parallelism: the (dp, tp) mesh, native tensor parallelism, data-parallel wrapping,
mesh-aware gradient clipping and two-stage seeding."""

from credit.parallel.collectives import clip_grad_norm_, sync_replicated_gradients, total_grad_norm
from credit.parallel.mesh import (
    ParallelLayout,
    build_device_mesh,
    init_distributed,
    launched_world_size,
    resolve_layout,
)
from credit.parallel.runtime import Runtime, build_runtime, resolve_device, shutdown
from credit.parallel.seeding import seed_for_init, seed_for_step
from credit.parallel.tensor_parallel import apply_native_tensor_parallel, supports_native_tp
from credit.parallel.wrap import parallelize_model, shard_units

__all__ = [
    "ParallelLayout",
    "Runtime",
    "apply_native_tensor_parallel",
    "build_device_mesh",
    "build_runtime",
    "clip_grad_norm_",
    "init_distributed",
    "launched_world_size",
    "parallelize_model",
    "resolve_device",
    "resolve_layout",
    "seed_for_init",
    "seed_for_step",
    "shutdown",
    "shard_units",
    "supports_native_tp",
    "sync_replicated_gradients",
    "total_grad_norm",
]
