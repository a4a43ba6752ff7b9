"""Legacy weights into a tensor-parallel (and FSDP2-sharded) trainer, from the file and converted.

The legacy model carries torch's hook-style spectral norm (`weight_orig`, `weight_u`,
`weight_v`, a fused `to_qkv`): its weights land in today's spectral norm, sharded over tp."""

import torch
import torch.distributed as dist
from launcher import run_ranks
from tiny import tiny_overrides
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, Shard

from credit.checkpoint.legacy import convert_checkpoint
from credit.data import model_layout
from credit.config import compose_config
from credit.models import build_legacy_model, remap_conv_state_dict
from credit.train.metrics import read_metrics
from credit.parallel import build_runtime
from credit.train.trainer import Trainer

Q = "stages.0.layers.0.0.to_q.weight"
QKV = "stages.0.layers.0.0.to_qkv"


def _full(tensor):
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().cpu().clone()


def resume_and_train(base, sources):
    """For each (run_dir, resume path): load, gather full weights and EMA, train 2 steps."""
    results = []
    for run_dir, source in sources:
        cfg = compose_config([*base, f"run_dir={run_dir}", f"trainer.resume={source}"])
        trainer = Trainer(cfg, build_runtime(cfg))
        trainer.setup()
        q = dict(trainer.model.named_parameters())[Q]
        sharded = isinstance(q, DTensor) and Shard(0) in q.placements
        model = get_model_state_dict(
            trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        model = {k: _full(v) for k, v in model.items()}  # buffers come back uncopied: training moves u, v
        ema = {name: _full(t) for name, t in trainer.ema.shadow.items()}
        step = trainer.step
        trainer.fit()
        if dist.get_rank() == 0:
            results.append({"step": step, "sharded": sharded, "model": dict(model), "ema": ema})
        else:
            results.append({"step": step, "sharded": sharded})
    return results


def test_legacy_spectral_norm_weights_load_bitwise_into_fsdp2_tp2_and_training_runs(tiny_data, tmp_path):
    base = tiny_overrides(tiny_data, "trainer.batch_size=2", "data.valid_samples=4",
                          "trainer.max_steps=2", "trainer.ema.enabled=true", "model.use_spectral_norm=true")
    cfg = compose_config([*base, f"run_dir={tmp_path / 'unused'}"])
    torch.manual_seed(3)
    legacy_state = build_legacy_model(cfg.model, **model_layout(cfg.data)).state_dict()
    assert f"{QKV}.weight_orig" in legacy_state and f"{QKV}.weight_u" in legacy_state
    legacy_file = tmp_path / "legacy.pt"
    torch.save({"model_state_dict": legacy_state, "epoch": 12}, legacy_file)
    converted = convert_checkpoint(legacy_file, tmp_path / "converted", cfg)
    expected = remap_conv_state_dict(legacy_state)

    sources = [(str(tmp_path / "from_dcp"), str(converted)), (str(tmp_path / "from_file"), str(legacy_file))]
    per_rank = run_ranks(resume_and_train, 4, [*base, "parallelism=fsdp2_tp2"], sources)

    for rank_results in per_rank:
        assert [r["step"] for r in rank_results] == [0, 0]  # weights only: step 0
        assert all(r["sharded"] for r in rank_results)  # q really is column-sharded over tp
    for result in per_rank[0]:
        assert result["model"].keys() == expected.keys()
        for key, tensor in expected.items():
            assert torch.equal(result["model"][key], tensor), key
        assert f"{Q[:-len('weight')]}weight_u" in result["model"]  # u, v loaded (compared above)
        for name, tensor in result["ema"].items():
            assert torch.equal(tensor, expected[name]), name  # EMA starts from the loaded weights
        assert not any(name.endswith(("weight_u", "weight_v")) for name in result["ema"])
    for run_dir, _ in sources:
        rows = read_metrics(f"{run_dir}/metrics.csv")
        assert [int(r["step"]) for r in rows] == [1, 2] and all(float(r["loss"]) > 0 for r in rows)
