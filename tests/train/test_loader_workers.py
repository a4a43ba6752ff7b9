"""DataLoader workers change nothing a run computes: their samples arrive in pooled shared
buffers that the trainer releases back to them, and the losses are the bits of a run that
loads in-process."""

from credit.config import compose_config
from credit.train import run_training
from credit.train.metrics import MEASURED_COLUMNS, read_metrics


def _rows(run_dir):
    path = run_dir / "metrics.csv"
    train = [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(path)]
    valid = [{k: v for k, v in r.items() if k not in MEASURED_COLUMNS} for r in read_metrics(path, "valid")]
    return train, valid


def test_workers_and_recycled_buffers_give_the_same_losses(tmp_path, tiny_overrides):
    """Batches of one: each is a view of a worker's pooled buffers, which the trainer releases
    back to it (stacked batches copy; tests/data/test_buffers.py covers those)."""
    common = ["model.attn_dropout=0.1", "trainer.max_steps=8", "trainer.checkpoint.every_n_steps=0",
              "trainer.valid_every_n_steps=4", "trainer.batch_size=1"]
    runs = {}
    for workers in (0, 2):
        run_dir = tmp_path / f"workers{workers}"
        run_training(compose_config(tiny_overrides(run_dir, *common, f"data.num_workers={workers}")))
        runs[workers] = _rows(run_dir)
    assert len(runs[0][0]) == 8 and len(runs[0][1]) == 2  # 8 training steps, 2 validations
    assert runs[2] == runs[0]  # raw strings: bitwise-equal floats
