"""CREDIT's deterministic training losses (`trainer.loss.function`): each elementwise error
against CREDIT's own loss classes on the same tensors (tests/fixtures/credit_losses, made
with CREDIT's `credit.losses.load_loss`; see its meta.json), and the trainer using the one
its config names."""

from pathlib import Path

import pytest
import torch
from credit_fixtures import sum_rounding_bound
from torch.overrides import TorchFunctionMode

from credit.config import ConfigError, compose_config
from credit.config.validate import LOSS_FUNCTIONS
from credit.train import run_training
from credit.train.deterministic import sample_sums
from credit.train.losses import ERRORS, WeightedLoss
from credit.train.metrics import read_metrics

FIXTURE = Path(__file__).parent.parent / "fixtures" / "credit_losses"


def test_every_function_has_a_credit_reference_and_a_config_name():
    assert tuple(ERRORS) == LOSS_FUNCTIONS
    assert set(torch.load(FIXTURE / "losses.pt")) == set(ERRORS)


class _RoundEveryOp(TorchFunctionMode):
    """Scales each torch op's result by (1 + d), d a zero leaf: d(result)/d(d) is how much a
    relative rounding error of that op moves the result."""

    def __init__(self) -> None:
        super().__init__()
        self.deltas: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        delta = torch.zeros_like(out, requires_grad=True)
        self.deltas.append(delta)
        return out * (1 + delta)


def rounding_bound(function: str, prediction: torch.Tensor, target: torch.Tensor, delta: float) -> torch.Tensor:
    """First-order bound, per element, on |fp32 error - exact| when every op of the error's
    expression returns within 2 ulps (2 x fp32 eps relative) of its exact result: torch's
    transcendental kernels (MKL VML's high-accuracy mode, Sleef's u10 functions, libm) are
    within 1 ulp, +-*/ within half of one, and which of them runs depends on the CPU."""
    p, t = prediction.double().requires_grad_(), target.double()
    with _RoundEveryOp() as mode:
        error = ERRORS[function](p, t, delta)
    sensitivities = torch.autograd.grad(error.sum(), mode.deltas, allow_unused=True)
    return 2 * torch.finfo(torch.float32).eps * sum(s.abs() for s in sensitivities if s is not None)


@pytest.mark.parametrize("function", LOSS_FUNCTIONS)
def test_the_loss_is_credits_on_the_same_tensors(function):
    inputs, credit = torch.load(FIXTURE / "inputs.pt"), torch.load(FIXTURE / "losses.pt")[function]
    prediction, target = inputs["prediction"][:, :, 0], inputs["target"][:, :, 0]  # (B, C, lat, lon)
    delta = credit["params"].get("delta", 1.0)
    loss = WeightedLoss(torch.ones(prediction.shape[2]), torch.ones(prediction.shape[1]), function, huber_delta=delta)
    ours = loss.weighted_error(prediction, target)
    reference = credit["elementwise"][:, :, 0]
    # CREDIT's run and ours each lie within the rounding bound of the exact value, so they lie
    # within twice it of each other (msle subtracts nearly equal logarithms, logcosh takes the log
    # of a cosh near 1: a relative tolerance fails there on a CPU whose log or cosh rounds
    # another way, as MKL's log does on an AVX-512 Xeon and torch's scalar cosh does)
    bound = 2 * rounding_bound(function, prediction, target, delta)
    excess = ((ours.double() - reference.double()).abs() - bound).max()
    assert excess <= 0, (function, float(excess), float((ours - reference).abs().max()))
    # the means: each element's bound, and each run's summation error
    allowed = float(bound.mean()) + 2 * sum_rounding_bound(ours.numel()) * float(reference.abs().mean())
    assert abs(float(loss(prediction, target)) - float(credit["mean"])) <= allowed


def test_the_trainer_uses_the_configured_function(tmp_path, tiny_overrides):
    """huber with a delta no error reaches is 0.5 x the squared error, exactly (a power of
    two): the first step's loss, on the same initial weights and batch, is half mse's."""
    first = {}
    for name, extra in [("mse", []), ("huber", ["trainer.loss.huber_delta=1e9"])]:
        run = tmp_path / name
        run_training(compose_config(tiny_overrides(run, "trainer.max_steps=1", "trainer.valid_every_n_steps=0",
                                                   f"trainer.loss.function={name}", *extra)))
        first[name] = float(read_metrics(run / "metrics.csv")[0]["loss"])
    assert first["huber"] == 0.5 * first["mse"] and first["mse"] > 0


def test_deterministic_mode_sums_the_configured_error():
    """Deterministic mode's per-sample sums (the fixed K tree) take the same weighted error:
    huber at a delta no error reaches halves mse's sums exactly, and each function's sums
    are its elementwise errors' sums."""
    inputs = torch.load(FIXTURE / "inputs.pt")
    prediction, target = inputs["prediction"][:, :, 0], inputs["target"][:, :, 0]
    lat, chan = torch.linspace(0.5, 1.5, prediction.shape[2]), torch.linspace(1.0, 2.0, prediction.shape[1])
    losses = {name: WeightedLoss(lat, chan, name, huber_delta=1e9) for name in LOSS_FUNCTIONS}
    sums = {name: sample_sums(prediction, target, loss.weighted_error) for name, loss in losses.items()}
    assert torch.equal(sums["huber"], 0.5 * sums["mse"])
    for name, loss in losses.items():
        expected = loss.weighted_error(prediction, target).double().sum(dim=(1, 2, 3))
        assert torch.allclose(sums[name].double(), expected, rtol=1e-5), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_sums_are_the_gemms_row_sums_forward_and_backward(dtype):
    """Per-sample sums are `weighted @ ones` through the deterministic GEMM, and their
    gradient has that product's backward's bits (each element g * 1) without forming it."""
    from credit.kernels.gemm import det_mm

    gen = torch.Generator().manual_seed(3)
    prediction = torch.randn(5, 3, 7, 9, generator=gen).to(dtype).requires_grad_()
    target = torch.randn(5, 3, 7, 9, generator=gen).to(dtype)
    seed = torch.randn(5, generator=gen).to(dtype)

    def error(p, t):
        return (p - t) ** 2 * torch.linspace(0.5, 1.5, 7, dtype=dtype).view(1, 1, -1, 1)

    sums = sample_sums(prediction, target, error)
    (grad,) = torch.autograd.grad(sums, prediction, seed)
    weighted = error(prediction, target).reshape(5, -1)
    want = det_mm(weighted, torch.ones(weighted.shape[1], 1, dtype=dtype))[:, 0]
    (want_grad,) = torch.autograd.grad(want, prediction, seed)
    assert torch.equal(sums, want) and torch.equal(grad, want_grad)


def test_deterministic_validation_loss_is_the_same_at_any_thread_count():
    """Deterministic mode's validation loss per sample (`WeightedLoss.sample_mean`, the
    trainer's choice there) has the same bits with one intra-op thread as with two, where
    torch's `mean` splits a large sample's reduction between threads; and it is that mean up to
    rounding."""
    gen = torch.Generator().manual_seed(4)
    prediction, target = torch.randn(2, 4, 96, 128, generator=gen), torch.randn(2, 4, 96, 128, generator=gen)
    loss = WeightedLoss(torch.linspace(0.5, 1.5, 96), torch.linspace(1.0, 2.0, 4))
    threads = torch.get_num_threads()
    try:
        values = []
        for n in (1, 2):
            torch.set_num_threads(n)
            values.append(loss.sample_mean(prediction[1:], target[1:]))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(values[0], values[1])
    assert torch.allclose(values[0].double(), loss.weighted_error(prediction[1:], target[1:]).double().mean())


@pytest.mark.parametrize("override, named", [("trainer.loss.function=crps", "trainer.loss.function='crps'"),
                                              ("trainer.loss.huber_delta=0", "trainer.loss.huber_delta=0")])
def test_a_bad_loss_key_is_one_error_naming_it(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("'", "'")):
        compose_config([override])
