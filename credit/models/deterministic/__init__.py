"""The layers of deterministic mode (`model.gemm=deterministic`) both model families build
from `credit.models.layer_kit`: Linear-free convolutions as fixed-tree GEMMs (`conv`), norms
and affines with tree gradients (`layers`), and activations whose bits do not depend on
where an element sits (`pointwise`)."""
