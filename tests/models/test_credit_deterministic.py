"""CREDIT's models in deterministic mode (`model.gemm=deterministic`), one process: the same
state-dict keys as the fast mode, a forecast that is the same alone or inside a batch, and
gradients of two halves of a batch (dropout on) that add up to the whole batch's bit for
bit, the property a dp2 split relies on. Tensor parallelism: tests/parallel/
test_credit_deterministic_tp.py; whole training runs: tests/train/test_deterministic_training.py."""

import pytest
import torch

from credit.kernels.gemm._tree import tree_sum
from credit.models.credit.config import build_credit_model, resolve_credit_model
from credit.models.dropout import dropout_step
from credit.train.deterministic import sample_sums

GRID = (16, 32)
COMMON = dict(image_height=GRID[0], image_width=GRID[1], frames=2, channels=2, levels=2, surface_channels=1,
              input_only_channels=2, output_only_channels=1, dim=[8, 16, 32, 64], depth=[1, 1, 1, 1],
              dim_head=4, local_window_size=[2, 2, 2, 1], global_window_size=[2, 2, 1, 1],
              cross_embed_kernel_sizes=[[2, 4]] * 4, cross_embed_strides=[2, 2, 2, 2],
              attn_dropout=0.1, ff_dropout=0.1)
MODELS = {
    # earth padding 8 rows north and south (a 32 x 32 grid; 16 and 4 tokens per sample at
    # stages 2 and 3, not whole 32-row leaves). Spectral norm off: its backward runs on each
    # rank's gradient before the dp sum, so it is bitwise across tp degrees
    # (tests/parallel/test_credit_deterministic_tp.py) but not across dp degrees
    "wxformer": dict(type="wxformer", use_spectral_norm=False,
                        padding_conf=dict(activate=True, mode="earth", pad_lat=[8, 8], pad_lon=[0, 0])),
    "nextgen_wxformer": dict(type="nextgen_wxformer", use_spectral_norm=False, col_attn_heads=2,
                          num_spectral_nodes=8, decoder_col_attn=True),
}
IN_CHANNELS = 2 * 2 + 1 + 2


def model(name: str, gemm: str = "deterministic") -> torch.nn.Module:
    torch.manual_seed(0)
    kind, values = resolve_credit_model({**COMMON, **MODELS[name]})
    return build_credit_model(kind, values, gemm)


def inputs(n: int) -> torch.Tensor:
    i = torch.arange(n * IN_CHANNELS * 2 * GRID[0] * GRID[1], dtype=torch.float64)
    return torch.sin(i * 0.113).view(n, IN_CHANNELS, 2, *GRID).float()


@pytest.mark.parametrize("name", list(MODELS))
def test_modes_share_state_dict_keys_and_shapes(name):
    fast, det = model(name, "fast").state_dict(), model(name).state_dict()
    assert {k: v.shape for k, v in fast.items()} == {k: v.shape for k, v in det.items()}


@pytest.mark.parametrize("name", list(MODELS))
def test_a_forecast_is_the_same_alone_or_in_a_batch(name):
    net = model(name).eval()
    x = inputs(3)
    with torch.no_grad():
        batched = net(x)
        for i in range(3):
            assert torch.equal(net(x[i:i + 1])[0], batched[i]), f"sample {i}"
        fast = model(name, "fast").eval()
        fast.load_state_dict(net.state_dict())
        # the same function as the fast mode, up to float32 reassociation (a LayerNorm over
        # nextgen_wxformer's two output channels in the decoder's column attention amplifies it)
        reference = fast(x)
        assert ((reference - batched).abs().max() / reference.abs().max()).item() < 1e-4


def _grads(net, x, target, first_sample, global_batch):
    net.zero_grad(set_to_none=True)
    with dropout_step(seed=3, step=1, sample_offset=first_sample, local_batch=x.shape[0]):
        sums = sample_sums(net(x), target, lambda p, t: (p - t) ** 2)
        (tree_sum(list(sums.unbind(0))) * (1.0 / (global_batch * target[0].numel()))).backward()
    return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_of_two_halves_add_up_to_the_whole_batch_bitwise(name):
    net = model(name).train()
    x = inputs(4)
    target = torch.cos(x[:, :6, 1:2] * 3.0)
    whole = _grads(net, x, target, 0, 4)
    first = _grads(net, x[:2], target[:2], 0, 4)
    second = _grads(net, x[2:], target[2:], 2, 4)
    assert any(".dpb." in n for n in whole)
    different = [n for n in whole if not torch.equal(first[n] + second[n], whole[n])]
    assert not different, different


# CUDA runs these backwards with atomic adds, so their bits vary from run to run there
# (torch.use_deterministic_algorithms lists them); deterministic mode must not call them
SCATTERING_OPS = {"upsample_bilinear2d_backward", "index_put", "index_put_", "_index_put_impl_",
                  "index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce",
                  "embedding_dense_backward", "_adaptive_avg_pool2d_backward", "put_"}
# CREDIT's production strides (the first 4: the decoder ends in a 2x bilinear upsampling) and
# pooled column attention in the decoder (resized back bilinearly)
RESIZING = dict(image_height=32, image_width=64, cross_embed_strides=[4, 2, 2, 2],
                cross_embed_kernel_sizes=[[4, 8], [2, 4], [2, 4], [2, 4]], local_window_size=[2, 2, 1, 1],
                global_window_size=[2, 2, 1, 1], frames=1)


def _ops_of_a_training_step(name: str, gemm: str) -> set[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func._schema.name.split("::")[-1])
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    extra = dict(col_attn_stride=2) if name == "nextgen_wxformer" else dict(padding_conf=None)
    kind, values = resolve_credit_model({**COMMON, **MODELS[name], **RESIZING, **extra})
    net = build_credit_model(kind, values, gemm).train()
    x = torch.randn(2, IN_CHANNELS, 1, 32, 64)
    with dropout_step(seed=3, step=1, sample_offset=0, local_batch=2), Recorder() as recorder:
        net(x).square().mean().backward()
    return recorder.names


@pytest.mark.parametrize("name", list(MODELS))
def test_deterministic_mode_calls_no_op_that_scatters_with_atomics_on_cuda(name):
    fast = _ops_of_a_training_step(name, "fast")
    assert "upsample_bilinear2d_backward" in fast  # the configuration does resize
    scattering = _ops_of_a_training_step(name, "deterministic") & SCATTERING_OPS
    assert not scattering, scattering


def test_deterministic_resize_and_position_bias_gather_are_torchs_up_to_rounding():
    from credit.models.credit.convs import resize
    from credit.models.credit.layers import gather_position_bias, relative_bias_indices

    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 7, requires_grad=True)
    u, m = 2.0 ** -24, float(x.abs().max())
    # an error bound: per axis a source coordinate s = (in / out)(dst + 1/2) - 1/2 within 3u of
    # the input's size, its weights 1 - frac(s) and frac(s) within one more u, and the weighted
    # sum's two roundings: (3u in + u) 2m + 2um; two axes, and twice that between two runs
    # (measured: 1.2e-6 on a Zen 3's AVX2 path, 1.3e-6 on its scalar one, where torch's
    # coordinates round another way)
    forward = 2 * 2 * ((3 * u * max(x.shape[2:]) + u) * 2 * m + 2 * u * m)
    for size in [(10, 14), (8, 21), (3, 4), (5, 9)]:
        ours = resize(x, size, deterministic=True)
        theirs = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
        assert torch.allclose(ours, theirs, rtol=0, atol=forward), size
        g = torch.randn_like(theirs)
        (mine,) = torch.autograd.grad(ours, x, g)
        (ref,) = torch.autograd.grad(theirs, x, g)
        # measured spread: <= 1.3e-6 on the AVX2 and scalar paths; 7x that
        assert torch.allclose(mine, ref, rtol=0, atol=1e-5), size
    table = torch.randn(3, 7 * 7)
    assert torch.equal(gather_position_bias(table, 3), table[:, relative_bias_indices(3)])


@pytest.mark.parametrize("batch, windows, heads, length", [(4, 8, 4, 9), (3, 37, 2, 4)])
def test_shared_bias_gradient_is_each_samples_own_row_tree(batch, windows, heads, length):
    """The bias gradient of a batch (one call over all samples) is, per sample, the row tree
    over that sample's (head, window) rows with each head's windows one group: the same bits
    as the sample alone, and the sum autograd would give up to rounding."""
    from credit.kernels.gemm._ops import row_sum
    from credit.models.credit.deterministic_attention import _HeadSharedBias

    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(batch, windows, heads, length, length, generator=gen)
    bias = torch.randn(batch, length, length, generator=gen, requires_grad=True)
    g = torch.randn(scores.shape, generator=gen)
    (got,) = torch.autograd.grad(_HeadSharedBias.apply(scores, bias, None), bias, g)
    for i in range(batch):
        rows = g[i].permute(1, 0, 2, 3).reshape(heads * windows, length * length)
        want = row_sum(rows, heads, "cpu", torch.float32).view(length, length)
        assert torch.equal(got[i].view(torch.int32), want.view(torch.int32))
    assert torch.allclose(got, g.sum((1, 2)), atol=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_whole_reductions_follow_the_tp_plans(name):
    """`build_model`'s marks, from the plans alone: a colwise layer's forward K and a rowwise
    layer's input-gradient N are whole, the reductions tensor parallelism splits are not, and
    a layer no plan names keeps both whole (the triton backend's one chain; docs/kernels.md)."""
    from credit.kernels.gemm import DetLinear
    from credit.models.layer_kit import mark_whole_reductions

    net = model(name)
    mark_whole_reductions(net)
    planned = {}
    for block in net.modules():
        for path, style in (getattr(block, "_tp_plan", None) or {}).items():
            planned[id(block.get_submodule(path))] = style
    linears = [m for m in net.modules() if isinstance(m, DetLinear)]
    styles = {planned.get(id(m)) for m in linears}
    assert styles == {"colwise", "rowwise", None}, styles  # every case is present
    expected = {"colwise": (True, False), "rowwise": (False, True), None: (True, True)}
    for layer in linears:
        assert layer.whole_reductions == expected[planned.get(id(layer))], layer


@pytest.mark.parametrize("chunk_bytes", [1, 3000, 1 << 30])  # a row at a time, a few, all at once
@pytest.mark.parametrize("shape", [(7, 4, 18, 8), (3, 2, 5, 16)])
def test_recomputed_attention_is_the_written_out_chain_bitwise_and_keeps_no_probabilities(shape, chunk_bytes):
    """nextgen_wxformer's column attention: the output and the q, k, v gradients of
    softmax(q kᵀ · scale) v as autograd takes them, bit for bit, with q, k and v the only
    tensors kept for backward (the (..., L, L) probabilities are recomputed), made in chunks
    of the leading dimension or all at once."""
    import math

    from credit.models.credit.deterministic_attention import recomputed_attention

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(shape, generator=gen).requires_grad_() for _ in range(3))
    upstream = torch.randn(shape, generator=gen)
    scale = 1 / math.sqrt(shape[-1])
    written_out = torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1), v)
    expected = torch.autograd.grad(written_out, (q, k, v), upstream)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        out = recomputed_attention(q, k, v, scale, chunk_bytes)
    assert torch.equal(out, written_out)
    for what, a, b in zip("qkv", torch.autograd.grad(out, (q, k, v), upstream), expected):
        assert torch.equal(a, b), f"d{what} differs"
    assert saved == [shape] * 3, saved
