"""`credit plan`'s traced estimates against real training steps on real gloo ranks.

The estimate of a step's memory (peak minus what is held between steps) must be within 10%
of the measured one, and the parameter, gradient and optimizer bytes of a dp2 x tp2 rank
within 10% too, on CREDIT's wxformer at a small size (benchmarks/plan_accuracy.py measures).
"""

import pytest
from launcher import run_ranks
from plan_accuracy import CROSSFORMER, LAYOUTS, measure_step
from tiny import tiny_data_overrides

from credit.config import compose_config
from credit.plan.shapes import sample_shapes
from credit.plan.trace import trace_step

HELD = ["one process", "tp2 + sequence parallel", "dp2 x tp2 fsdp2"]  # the layouts held to 10%


@pytest.mark.parametrize("name", HELD)
def test_estimate_within_ten_percent_of_a_measured_step(tiny_data, name):
    world, layout = LAYOUTS[name]
    overrides = tiny_data_overrides(tiny_data, *CROSSFORMER, *layout)
    measured = measure_step(overrides) if world == 1 else run_ranks(measure_step, world, overrides)[-1]
    cfg = compose_config(overrides)
    estimate = trace_step(cfg, sample_shapes(cfg, (16, 32)), world)  # the last rank, as measured[-1]
    assert abs(estimate.activation / measured["tensor_peak"] - 1) <= 0.10, (estimate, measured)
    for key in ("params", "grads", "optimizer"):
        assert abs(getattr(estimate, key) / measured[key] - 1) <= 0.10, (key, estimate, measured)
    # the scratch space left out is the kernels' own (gloo's staging, CPU im2col), not tensors
    assert measured["peak"] >= measured["tensor_peak"]


def test_ddp_sends_twice_the_half_of_its_gradients():
    """An all-reduce over 2 replicas sends 2 (n-1)/n = 1 x the gradients: DDP's whole traffic."""
    cfg = compose_config([*CROSSFORMER, "trainer.parallelism.data=ddp", "trainer.batch_size=1"])
    trace = trace_step(cfg, sample_shapes(cfg, (16, 32)), 2)
    assert set(trace.sent) == {"dp"}, trace.sent
    assert trace.sent["dp"] == pytest.approx(trace.grads, rel=1e-3), trace


def test_tensor_and_sequence_parallelism_divide_the_step_memory():
    """On a grid whose every stage splits over 4 ranks (256 x 512), tp=4 shards attention and
    feed-forward, and sequence parallelism the rest of the activations too."""
    crossformer = ["model=wxformer", "model.dim=[32,64,128,256]", "trainer.batch_size=1"]
    traces = {}
    for tp, sp in ((1, False), (4, False), (4, True)):
        cfg = compose_config([*crossformer, f"trainer.parallelism.tensor={tp}",
                              f"trainer.parallelism.sequence_parallel={str(sp).lower()}"])
        traces[(tp, sp)] = trace_step(cfg, sample_shapes(cfg, (256, 512)), tp)
    one, tp4, tp4sp = traces[(1, False)], traces[(4, False)], traces[(4, True)]
    assert tp4sp.activation < 0.45 * one.activation and tp4.activation < 0.75 * one.activation, traces
    assert tp4sp.activation < 0.7 * tp4.activation, traces
    assert tp4sp.sent["tp"] > 0 and not one.sent


def test_frozen_parameters_hold_no_optimizer_state_in_the_plan_as_in_a_step(tiny_data):
    """crossformer-ensemble with `model.freeze` (CREDIT's fine-tuning: only the noise layers
    train): the plan's parameter, gradient and optimizer bytes are a real step's, bytes for bytes;
    the optimizer holds the moments of the trainable few, not of every parameter."""
    overrides = tiny_data_overrides(tiny_data, "model=crossformer-ensemble", "model.dim=[16,32,64,128]",
                                    "model.dim_head=8", "model.freeze=true", "trainer.ensemble_size=2",
                                    "trainer.loss.function=kcrps", "trainer.batch_size=2")
    measured = measure_step(overrides)
    cfg = compose_config(overrides)
    estimate = trace_step(cfg, sample_shapes(cfg, (16, 32)), 1)
    assert (estimate.params, estimate.grads, estimate.optimizer) == \
        (measured["params"], measured["grads"], measured["optimizer"]), (estimate, measured)
    assert 0 < estimate.optimizer < 0.25 * estimate.params, estimate  # the moments of the noise layers only


def test_an_ensemble_axis_is_traced_after_a_layout_without_one():
    """`credit plan` traces the layouts of one run in one process: a dp2 x tp2 trace, then a
    dp1 x ens2 x tp2 one with sequence parallelism, whose groups are numbered otherwise (DTensor's
    cached specs would hand it the first trace's destroyed groups). The member blocks' gather
    is counted on the ens group, and the gradients' reduction over dp x ens."""
    ensemble = ["model=crossformer-ensemble", "model.noise_latent_dim=8", "model.dim=[8,16,32,64]",
                "model.dim_head=4", "model.local_window_size=[2,2,2,1]", "model.global_window_size=[2,2,1,1]",
                "trainer.ensemble_size=4", "trainer.loss.function=kcrps", "trainer.parallelism.data=fsdp2",
                "trainer.parallelism.tensor=2"]
    first = compose_config([*ensemble, "trainer.batch_size=1"])
    trace_step(first, sample_shapes(first, (16, 32)), 4)
    spread = compose_config([*ensemble, "trainer.batch_size=2", "trainer.parallelism.ensemble=2",
                             "trainer.parallelism.sequence_parallel=true"])
    trace = trace_step(spread, sample_shapes(spread, (16, 32)), 4)
    assert trace.sent["ens"] > 0 and trace.sent["dp×ens"] > 0 and trace.collectives["tp"] > 0, trace
