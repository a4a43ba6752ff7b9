"""A tiny model trained for a few dozen steps (with EMA), and a rollout of it: shared by the
rollout tests, built once per session from real files, real hydra composition and real DCP."""

import pytest
from rollouthelpers import INITS, LEAD_STEPS, TRAIN

from credit.config import compose_config
from credit.rollout import run_rollout
from credit.train import run_training


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tiny_data):
    """(run_dir, overrides(*extra)) of a 40-step tiny run with EMA and checkpoints 20, 40."""
    from tiny import tiny_overrides

    run_dir = tmp_path_factory.mktemp("rollout_run") / "run"

    def overrides(*extra: str) -> list[str]:
        return tiny_overrides(tiny_data, f"run_dir={run_dir}", *TRAIN, *extra)

    run_training(compose_config(overrides()))
    return run_dir, overrides


@pytest.fixture(scope="session")
def rollout(trained_run):
    """The rollout of `trained_run` from INITS for LEAD_STEPS leads, with its config."""
    run_dir, overrides = trained_run
    cfg = compose_config(overrides(f"rollout.init_times=[{','.join(INITS)}]",
                                   f"rollout.lead_steps={LEAD_STEPS}"))
    return run_rollout(cfg), cfg
