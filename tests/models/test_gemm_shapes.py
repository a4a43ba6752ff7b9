"""Projection GEMM shapes traced on the meta device (benchmarks/gemm.py --shapes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from credit.models.gemm_shapes import credit_section_gemms, projection_gemms

REPO = Path(__file__).resolve().parents[2]


def test_credit_025deg_crossformer_shapes_follow_from_its_config():
    section = yaml.safe_load((REPO / "benchmarks/configs/wxformer_0.25deg.yml").read_text())["model"]
    counts = credit_section_gemms(section)
    # stage 0 sees the padded grid (721 + 2*40) x (1440 + 2*80) halved by the first stride
    height = (section["image_height"] + sum(section["padding_conf"]["pad_lat"])) // 2
    width = (section["image_width"] + sum(section["padding_conf"]["pad_lon"])) // 2
    assert (height, width) == (400, 800)
    expected = {}
    for stage, (dim, depth) in enumerate(zip(section["dim"], section["depth"])):
        tokens = (height >> stage) * (width >> stage)
        inner = dim  # CREDIT's default dim_head 32 gives dim // 32 heads of 32: the inner width is dim
        # every round: a local and a global attention (q, k, v, out) and a feed-forward (x4) after each
        expected[(tokens, dim, inner)] = 2 * depth * 4
        expected[(tokens, dim, 4 * dim)] = 2 * depth
        expected[(tokens, 4 * dim, dim)] = 2 * depth
    assert dict(counts) == expected


def test_tracing_refuses_a_model_with_real_parameters():
    with pytest.raises(ValueError, match="meta device"):
        projection_gemms(nn.Linear(4, 4), lambda m: m(torch.empty(2, 4, device="meta")))


def test_linear_and_pointwise_convolutions_are_counted_per_call():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
        conv = nn.Conv2d(3, 5, 1)
    x = torch.empty(2, 6, 8, device="meta")
    assert projection_gemms(model, lambda m: m(m(x))) == {(12, 8, 16): 2, (12, 16, 8): 2}
    image = torch.empty(2, 3, 4, 5, device="meta")
    assert projection_gemms(conv, lambda m: m(image)) == {(40, 3, 5): 1}
