"""`credit train` with CREDIT's two CrossFormers in deterministic mode: data parallelism
changes no bit, spectral norm on or off.

Earth padding, dropout 0.1, EMA on, CREDIT's tracer and mass-fixer post blocks (the mass
fixer after the model on wxformer, inside it on crossformer), one global batch of 4, 8 steps
with validation at 4 and 8 (the older crossformer with its bilinear decoder and mixed decoder
attention: 4 steps, validation at 2 and 4): one process against dp2 (FSDP2, 2 samples per
rank), so the post blocks' global sums see 4 and 2 samples; CREDIT's `grad_max_norm: dynamic`
(its limit sqrt(ranks x the norm) in fast mode, sqrt(the norm) at every layout in deterministic
mode). Every metrics.csv value and every
final model, EMA and optimizer tensor equal bitwise. Tensor parallelism of both CREDIT
models is bitwise at the model level (tests/parallel/test_credit_deterministic_tp.py); the
whole (dp, tp) matrix through `credit train` is run on the default model
(tests/train/test_deterministic_training.py).
"""

import os

import pytest
from test_deterministic_training import _same_bits
from tiny import post_block_overrides, tiny_data_overrides, write_physics_file
from launches import credit_command

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
WXFORMER = ["model=wxformer", "model.dim=[8,16,32,64]", "model.dim_head=4",
               "model.local_window_size=[2,2,2,1]", "model.global_window_size=[2,2,1,1]",
               "model.padding_conf.activate=true", "model.padding_conf.pad_lat=[8,8]",
               "model.padding_conf.pad_lon=[0,0]", "model.gemm=deterministic",
               "model.attn_dropout=0.1", "model.ff_dropout=0.1", "trainer.max_steps=8",
               "trainer.valid_every_n_steps=4", "trainer.checkpoint.every_n_steps=0",
               "data.valid_samples=4", "trainer.ema.enabled=true",
               "trainer.grad_clip_dynamic=true"]  # CREDIT's grad_max_norm: dynamic, layout-free here
# four steps with validation at 2 and 4: the decoder's bits through dp2, at half the cost
CROSSFORMER = ["model=crossformer", "model.upsample_v_conv=true", "model.attention_type=mixed",
               *WXFORMER[1:], "trainer.max_steps=4", "trainer.valid_every_n_steps=2"]


def _train(nproc, *overrides):
    return credit_command("train", "--nproc", nproc, *overrides, env=ENV)


@pytest.mark.parametrize("model", [WXFORMER, CROSSFORMER], ids=["wxformer", "crossformer"])
def test_one_process_and_dp2_are_bitwise_equal(model, tiny_data, tmp_path):
    post_blocks = post_block_overrides(write_physics_file(tiny_data, tmp_path / "physics.nc"),
                                       outside=model is WXFORMER)
    runs = {}
    for dp in (1, 2):
        run = tmp_path / f"dp{dp}"
        result = _train(dp, *tiny_data_overrides(tiny_data, *model, *post_blocks, f"trainer.batch_size={4 // dp}",
                                                 "trainer.parallelism.data=fsdp2", f"run_dir={run}"))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[dp] = run
    _same_bits(runs[1], runs[2])


def test_spectral_norm_is_bitwise_in_one_process_and_at_dp2_ddp(tiny_data, tmp_path):
    """Every CREDIT production config normalises its weights: the normalisation's backward
    runs once on the gradient summed over every sample (credit.models.spectral_norm), so
    deterministic ddp over two replicas gives one process's bits (FSDP2 x TP:
    tests/parallel/test_credit_config_layouts.py)."""
    runs = {}
    for dp, accum in ((1, 1), (2, 1), (1, 2)):
        run = tmp_path / f"dp{dp}_accum{accum}"
        result = _train(dp, *tiny_data_overrides(tiny_data, *CROSSFORMER, "model.use_spectral_norm=true",
                                                 f"trainer.batch_size={4 // dp // accum}",
                                                 f"trainer.grad_accum_steps={accum}",
                                                 "trainer.parallelism.data=ddp", f"run_dir={run}"))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[dp, accum] = run
    _same_bits(runs[1, 1], runs[2, 1])
    _same_bits(runs[1, 1], runs[1, 2])


# CREDIT's noise-injecting CrossFormer, its noise layers training (freeze: CREDIT's default)
ENSEMBLE_CROSSFORMER = ["model=crossformer-ensemble", "model.noise_latent_dim=8", *WXFORMER[1:]]


@pytest.mark.parametrize("model", [WXFORMER, ENSEMBLE_CROSSFORMER], ids=["wxformer_dropout", "crossformer_ensemble"])
def test_an_ensembles_members_are_bitwise_in_one_process_and_at_dp2(model, tiny_data, tmp_path):
    """CREDIT's ensemble on the batch axis (trainer.ensemble_size 2, its KCRPS): each member's
    dropout masks and noise are keyed on its global row (sample and member), so one process
    holding both samples' members and two ranks holding one sample's each give the same bits."""
    runs = {}
    for dp in (1, 2):
        run = tmp_path / f"dp{dp}"
        result = _train(dp, *tiny_data_overrides(tiny_data, *model, "trainer.max_steps=4",
                                                 "trainer.valid_every_n_steps=2", "trainer.ensemble_size=2",
                                                 "trainer.loss.function=kcrps", f"trainer.batch_size={2 // dp}",
                                                 "trainer.parallelism.data=fsdp2", f"run_dir={run}"))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[dp] = run
    _same_bits(runs[1], runs[2])
