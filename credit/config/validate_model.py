"""Checks on `model.*` (with the tensor-parallel degree they must split over), and the two
splitting rules the model code applies too: whole attention heads per rank, and whole
32-wide reduction leaves per rank in deterministic mode."""

from __future__ import annotations

from omegaconf import DictConfig

from credit.config.checks import ConfigError, check, check_each


def heads_split_error(heads: int, tensor: int) -> str | None:
    """The rule for splitting attention over tensor-parallel ranks, stated once (the config
    check and `Attention._tp_constraints` both use it): each rank owns whole heads.
    None when `heads` splits over `tensor` ranks, else what would work."""
    if heads % tensor == 0:
        return None
    divisors = [d for d in range(1, heads + 1) if heads % d == 0]
    return f"each tensor-parallel rank must own whole attention heads; use tensor in {divisors}"


GEMM_MODES = ("fast", "deterministic")
# this project's names for CREDIT's classes are CREDIT's registry names (docs/credit_models.md)
CREDIT_MODELS = ("crossformer", "wxformer", "nextgen_wxformer", "crossformer-ensemble")
OLDER_CROSSFORMERS = ("crossformer", "crossformer-ensemble")  # the older decoder, its attention
ASYMMETRIC_CROSS_EMBED = ("wxformer", "nextgen_wxformer")  # ZeroPad2d(k - s) branches
DECODER_ATTENTION = ("coordinate", "eca", "spatial", "scse_optimized", "scse_standard", "mixed")
SPECTRAL_NORM_TP = ("shard", "replicate")


def deterministic_split_error(what: str, key: str, width: int, tensor: int) -> str | None:
    """The rule for layout-invariant tensor parallelism, stated once: the deterministic GEMM
    reduces over 32-wide leaves combined by a binary tree, so a split is a subtree of the
    one-rank reduction only when `tensor` is a power of two and each rank gets a multiple
    of 32. None when `width` (the `key` named) splits, else what would work."""
    from credit.kernels.gemm import LEAF

    if tensor == 1:
        return None
    if tensor & (tensor - 1):
        return (f"model.gemm=deterministic needs trainer.parallelism.tensor a power of two "
                f"(the GEMM's reduction tree splits in halves), got {tensor}")
    if width % (LEAF * tensor) == 0:
        return None
    return (f"model.gemm=deterministic with trainer.parallelism.tensor={tensor} needs {what} "
            f"{key}={width} to give a multiple of {LEAF} per rank, got {width / tensor:g}; use a "
            f"multiple of {LEAF * tensor} or a smaller tensor")


def _validate_stages(model: DictConfig, tensor: int, credit_layout: bool) -> None:
    """Stage lists, widths, heads and kernels: the rules both model families share."""
    stages = len(model.dim)
    check(stages >= 1, "model.dim", model.dim, "give at least one stage width")
    if credit_layout:
        check(stages == 4, "model.dim", model.dim, "CREDIT's models have four encoder stages")
    for key in ("depth", "local_window_size", "global_window_size", "cross_embed_kernel_sizes",
                "cross_embed_strides"):
        check(len(model[key]) == stages, f"model.{key}", model[key],
               f"needs one entry per stage ({stages}, the length of model.dim)")
    check_each("model.dim", model.dim, lambda d: d >= 1, "widths must be >= 1")
    check_each("model.depth", model.depth, lambda d: d >= 1, "depths must be >= 1")
    check(model.dim_head >= 1, "model.dim_head", model.dim_head, "must be >= 1")
    for i, width in enumerate(model.dim):
        check(width % model.dim_head == 0, "model.dim_head", model.dim_head,
               f"must divide every stage width (model.dim[{i}]={width})")
        heads = width // model.dim_head
        problem = heads_split_error(heads, tensor)
        check(problem is None, "trainer.parallelism.tensor", tensor,
               f"must divide the heads of every stage (stage {i} has {heads} heads = "
               f"model.dim[{i}]={width} / model.dim_head={model.dim_head}); {problem}")
    check_each("model.local_window_size", model.local_window_size, lambda w: w >= 1, "must be >= 1")
    check_each("model.global_window_size", model.global_window_size, lambda w: w >= 1, "must be >= 1")
    check_each("model.cross_embed_strides", model.cross_embed_strides, lambda s: s >= 1, "must be >= 1")
    for i, (kernels, stride) in enumerate(zip(model.cross_embed_kernel_sizes, model.cross_embed_strides)):
        check(len(kernels) >= 1, f"model.cross_embed_kernel_sizes[{i}]", kernels, "needs a kernel")
        for k in kernels:
            # wxformer and nextgen_wxformer pad each branch asymmetrically by k - stride; the
            # older crossformer and the windowformer by (k - stride) // 2 on each side
            asymmetric = model.name in ASYMMETRIC_CROSS_EMBED
            ok = k >= stride and (asymmetric or (k - stride) % 2 == 0)
            check(ok, f"model.cross_embed_kernel_sizes[{i}]", kernels,
                   f"each kernel must be >= the stride {stride}"
                   + ("" if asymmetric else " and differ from it by an even number")
                   + ", so the output grid is the input grid / stride")
    for key in ("attn_dropout", "ff_dropout"):
        check(0.0 <= model[key] < 1.0, f"model.{key}", model[key], "must be in [0, 1)")
    check(model.gemm in GEMM_MODES, "model.gemm", model.gemm, f"allowed: {list(GEMM_MODES)}")
    check(model.spectral_norm_tp in SPECTRAL_NORM_TP, "model.spectral_norm_tp", model.spectral_norm_tp,
           f"allowed: {list(SPECTRAL_NORM_TP)}")


def _validate_credit_model(model: DictConfig) -> None:
    last = model.dim[-1]
    doubling = [last // 8, last // 4, last // 2, last]
    check(list(model.dim) == doubling and last % 8 == 0, "model.dim", model.dim,
           "CREDIT's decoder needs stage widths that double: (d, 2d, 4d, 8d)")
    for key in ("image_height", "image_width", "frames", "channels", "levels"):
        check(model[key] is None or model[key] >= 1, f"model.{key}", model[key], "must be >= 1 or null")
    for key in ("surface_channels", "input_only_channels", "output_only_channels"):
        check(model[key] is None or model[key] >= 0, f"model.{key}", model[key], "must be >= 0 or null")
    if model.name in OLDER_CROSSFORMERS:
        check(model.attention_type in (None, "none", *DECODER_ATTENTION), "model.attention_type",
               model.attention_type, f"allowed: null, {', '.join(DECODER_ATTENTION)}")
    if model.name == "crossformer-ensemble":
        check(model.noise_latent_dim >= 1, "model.noise_latent_dim", model.noise_latent_dim, "must be >= 1")
        check(model.frames in (None, 1), "model.frames", model.frames, "1: CREDIT's crossformer-ensemble averages "
              "input frames in pairs where its encoder takes them stacked (data.history_len 1)")
    if model.name in (*OLDER_CROSSFORMERS, "wxformer"):
        pad = model.padding_conf
        check(pad.mode in ("earth", "mirror"), "model.padding_conf.mode", pad.mode, "allowed: 'earth', 'mirror'")
        for key in ("pad_lat", "pad_lon"):
            check(len(pad[key]) == 2 and min(pad[key]) >= 0, f"model.padding_conf.{key}", pad[key],
                   "must be two sizes >= 0")
    else:
        for key in ("col_attn_heads", "col_attn_stride", "num_spectral_nodes"):
            check(model[key] >= 1, f"model.{key}", model[key], "must be >= 1")


def validate_model(model: DictConfig, tensor: int = 1) -> None:
    credit_layout = model.name in CREDIT_MODELS
    check(credit_layout or model.name == "windowformer", "model.name", model.name,
           f"allowed: {['windowformer', *CREDIT_MODELS]}")
    _validate_stages(model, tensor, credit_layout)
    if credit_layout:
        _validate_credit_model(model)
    else:
        check(model.ff_mult >= 1, "model.ff_mult", model.ff_mult, "must be >= 1")
        check(model.padding in ("earth", "none"), "model.padding", model.padding,
               "allowed: 'earth', 'none'")
    if model.gemm == "deterministic":
        _validate_deterministic_tensor(tensor)


def _validate_deterministic_tensor(tensor: int) -> None:
    """The GEMM's reduction tree splits in halves: tensor parallelism in deterministic mode
    needs a power-of-two degree. (A block whose widths do not split into whole leaves is kept
    whole on every tp rank: `credit.parallel.tensor_parallel`.)"""
    problem = deterministic_split_error("", "", 0, tensor)
    if problem:
        raise ConfigError(problem)
