"""CREDIT's `crossformer-ensemble` (and `crossformer-style`, the same class):
`credit.models.wxformer.crossformer_ensemble.CrossFormerWithNoise`, the older CrossFormer
with stochastic decomposition layers that add style-modulated noise to the encoder stages'
outputs and to the first three up blocks' outputs. With CREDIT's state-dict keys:
`encoder_noise_layers.{0,1,2}` and `noise_inject{1,2,3}`, each `noise_transform` (a Linear
from the latent noise to the channels), `modulation` (1, C, 1, 1) and `noise_factor` (1,),
a parameter that never trains.

A layer adds noise_factor x z x (W n + b) x modulation to its feature map: z one value per
element, n a latent vector per sample (drawn for every layer, or with `correlated` once
per forward and shared). `freeze` freezes every weight of the CrossFormer, so only the noise
layers train (CREDIT fine-tunes a deterministic checkpoint this way); spectral norm, as in
CREDIT, covers the CrossFormer and not the noise layers. The noise is
`credit.models.noise.indexed_normal`, keyed on (seed, step, forward, layer, global row,
element) instead of CREDIT's `torch.randn`, so a member's noise is the same on any rank;
`noise_source` replaces it (tests feed CREDIT's recorded noise). The noise is drawn in
evaluation too, as CREDIT draws it: every forward needs the step context.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from credit.kernels.gemm import det_mm
from credit.models.credit.convs import resize
from credit.models.credit.crossformer import CrossFormer
from credit.models.credit.wxformer import CreditSpec
from credit.models.deterministic.norms import channel_affine
from credit.models.layer_kit import layer_kit
from credit.models.noise import indexed_normal, next_forward
from credit.models.padding import BoundaryPadding

NoiseSource = Callable[[tuple[int, ...], int, int, torch.device], torch.Tensor]
"""(shape, layer, forward, device) -> noise of that shape."""


class StochasticDecomposition(nn.Module):
    """CREDIT's StochasticDecompositionLayer: feature_map + noise_factor x z x style x
    modulation, style = noise_transform(latent) per sample and channel. In deterministic mode
    the weight gradients of `noise_transform` and `modulation` are sums over samples by the
    fixed tree (`layer_kit`, `channel_affine`), so splitting the batch changes no bit."""

    def __init__(self, noise_dim: int, channels: int, noise_factor: float, gemm: str = "fast") -> None:
        super().__init__()
        self.noise_transform = layer_kit(gemm).linear(noise_dim, channels)
        self.modulation = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.noise_factor = nn.Parameter(torch.tensor([float(noise_factor)]), requires_grad=False)
        self.deterministic = gemm == "deterministic"

    def forward(self, feature_map: torch.Tensor, latent: torch.Tensor, pixel_noise: torch.Tensor) -> torch.Tensor:
        batch, channels = feature_map.shape[:2]
        # (B, 1, L): one row per sample, so deterministic mode sums the weight gradient by sample
        style = self.noise_transform(latent.unsqueeze(1)).view(batch, channels, 1, 1)
        if not self.deterministic:
            return feature_map + self.noise_factor * pixel_noise * style * self.modulation
        noise = _PerSampleScale.apply(self.noise_factor * pixel_noise, style)
        modulated = channel_affine(noise.permute(0, 2, 3, 1), self.modulation.view(channels), None)  # channels last
        return feature_map + modulated.permute(0, 3, 1, 2)


class _PerSampleScale(torch.autograd.Function):
    """`x (B, C, H, W) * scale (B, C, 1, 1)`; the scale's gradient, a sum over each (sample,
    channel)'s grid, by the GEMM's K tree (a row of its own: the same bits at any batch size,
    where autograd's broadcast sum may reduce differently as the batch changes)."""

    @staticmethod
    def forward(ctx, x, scale):  # type: ignore[override]
        ctx.save_for_backward(x, scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, scale = ctx.saved_tensors
        rows = (grad * x).reshape(x.shape[0] * x.shape[1], -1)
        ones = torch.ones((rows.shape[1], 1), dtype=rows.dtype, device=rows.device)
        return grad * scale, det_mm(rows.contiguous(), ones).view(scale.shape)


class CrossFormerEnsemble(CrossFormer):
    """CREDIT's CrossFormerWithNoise (registry types `crossformer-ensemble`, `crossformer-style`)."""

    credit_type = "crossformer-ensemble"
    # what a deterministic CrossFormer's checkpoint lacks (credit.models.credit.checkpoint loads it)
    fresh_weight_prefixes = ("encoder_noise_layers.", "noise_inject")
    injects_noise = True  # in evaluation too: `credit rollout` members differ

    def __init__(self, spec: CreditSpec, *, noise_latent_dim: int = 128, encoder_noise_factor: float = 0.05,
                 decoder_noise_factor: float = 0.275, encoder_noise: bool = True, freeze: bool = True,
                 correlated: bool = False, interp: bool = True, padding: BoundaryPadding | None = None,
                 upsample_v_conv: bool = False, attention_type: str | None = None, gemm: str = "fast") -> None:
        if spec.frames != 1:
            raise ValueError(f"model.frames={spec.frames}: CREDIT's crossformer-ensemble averages input frames in "
                             "pairs where its encoder takes them stacked, so it runs with frames 1 only")
        super().__init__(spec, interp=interp, padding=padding, upsample_v_conv=upsample_v_conv,
                         attention_type=attention_type, gemm=gemm)
        self.noise_latent_dim, self.correlated, self.encoder_noise = noise_latent_dim, correlated, encoder_noise
        if freeze:  # before the noise layers exist: only they train
            for parameter in self.parameters():
                parameter.requires_grad = False
        widths = [spec.dim[-1] // 8, spec.dim[-1] // 4, spec.dim[-1] // 2]  # up_block3, 2, 1's outputs
        if encoder_noise:
            self.encoder_noise_layers = nn.ModuleList(
                StochasticDecomposition(noise_latent_dim, width, encoder_noise_factor, gemm) for width in widths)
        self.noise_inject1 = StochasticDecomposition(noise_latent_dim, widths[2], decoder_noise_factor, gemm)
        self.noise_inject2 = StochasticDecomposition(noise_latent_dim, widths[1], decoder_noise_factor, gemm)
        self.noise_inject3 = StochasticDecomposition(noise_latent_dim, widths[0], decoder_noise_factor, gemm)
        self.noise_source: NoiseSource = _indexed_noise

    def sequence_rows_fit(self, tp: int) -> str | None:
        return "the noise layers and the older CrossFormer's decoder run on the whole grid"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        spec.check_input(x, self.credit_type)
        inputs = x
        forward = next_forward() if self.noise_source is _indexed_noise else 0
        draws = iter(range(16))  # the order CREDIT draws in: a latent vector, then each layer's pixels

        def noisy(layer: nn.Module, feature_map: torch.Tensor, latent: torch.Tensor | None) -> torch.Tensor:
            if latent is None:
                latent = self.noise_source((feature_map.shape[0], self.noise_latent_dim), next(draws), forward,
                                           feature_map.device).to(feature_map.dtype)
            pixels = self.noise_source(tuple(feature_map.shape), next(draws), forward, feature_map.device)
            return layer(feature_map, latent, pixels.to(feature_map.dtype))

        shared = None
        if self.correlated:
            shared = self.noise_source((x.shape[0], self.noise_latent_dim), next(draws), forward,
                                       x.device).to(x.dtype)
        if self.padding:
            x = self.padding.pad(x)
        x = x.flatten(1, 2)
        encodings = []
        for stage, (embed, transformer) in enumerate(self.layers):
            x = transformer(embed(x))
            if self.encoder_noise and stage < len(self.layers) - 1:
                x = noisy(self.encoder_noise_layers[stage], x, shared)
            encodings.append(x)
        x = torch.cat([noisy(self.noise_inject1, self.up_block1(x), shared), encodings[2]], dim=1)
        x = torch.cat([noisy(self.noise_inject2, self.up_block2(x), shared), encodings[1]], dim=1)
        x = torch.cat([noisy(self.noise_inject3, self.up_block3(x), shared), encodings[0]], dim=1)
        x = self.up_block4(x)
        if self.padding:
            x = self.padding.unpad(x)
        if self.use_interp:
            x = resize(x, spec.grid, self.deterministic)
        x = x.unsqueeze(2).clone()
        if self.post_blocks is not None:
            x = self.post_blocks(x, inputs.detach())
        return x


def _indexed_noise(shape: tuple[int, ...], layer: int, forward: int, device: torch.device) -> torch.Tensor:
    return indexed_normal(shape, layer, forward, device)
