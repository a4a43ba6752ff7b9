"""`credit convert-checkpoint --credit-config CREDIT.yml CHECKPOINT.pt OUT`.

A CREDIT checkpoint and the `model:` section of the CREDIT config that trained it become a
weights-only DCP directory OUT (keys `model.*`, `config`, `source`) that `credit train
trainer.resume=OUT` continues (any dp x tp layout, fresh optimizer at step 0) and `credit
rollout` forecasts from. The model is built from the CREDIT config alone, so no data are
read; the run's config is this project's with `model=<type>` and one `model.<key>=<value>`
per CREDIT key, which are written to OUT/credit_overrides.txt and printed, ready to pass
to `credit train` (a run whose model keys differ is refused by the checkpoint's config check).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf

from credit.checkpoint.manager import _quiet_single_process
from credit.config import compose_config
from credit.models.credit.checkpoint import (load_credit_weights, read_credit_config, read_credit_model_section,
                                             read_credit_state_dict)
from credit.models.credit.config import (CREDIT_CLASSES, GEN2_POST_CONF, build_credit_model, count_parameters,
                                         credit_spec, hydra_value, ignored_keys, post_conf_overrides, refused_keys,
                                         resolve_credit_model)
from credit.models.credit.postblocks.settings import active_fixers

log = logging.getLogger(__name__)

OVERRIDES_FILE = "credit_overrides.txt"
_PER_STAGE = ("dim", "depth", "global_window_size", "local_window_size", "cross_embed_kernel_sizes",
              "cross_embed_strides")


def model_overrides(kind: str, values: Mapping[str, Any]) -> list[str]:
    """`model=<type>` and `model.<key>=<value>` reproducing a resolved CREDIT model."""
    spec = credit_spec(values)  # scalars per stage broadcast to the four stages, as CREDIT does
    values = {**values, **{key: getattr(spec, key) for key in _PER_STAGE}}
    overrides = [f"model={kind}"]
    for key, value in values.items():
        if key == "padding_conf":
            conf = dict(value or {"activate": False})
            for sub in ("activate", "mode", "pad_lat", "pad_lon"):
                if sub in conf:
                    overrides.append(f"model.padding_conf.{sub}={hydra_value(conf[sub])}")
            continue
        overrides.append(f"model.{key}={hydra_value(value)}")
    return overrides


def describe_credit_model(credit_config: str | Path) -> tuple[list[str], list[str], list[str]]:
    """What `credit check --credit-config` prints about a CREDIT config's `model:` section:
    (report lines, refused lines, the model overrides). The model is built on the meta
    device (nothing allocated), with any refused key set aside, to count its parameters."""
    config = read_credit_config(credit_config)
    section = read_credit_model_section(config)
    refused = refused_keys(section)
    kind, values = resolve_credit_model(section, warn=False, refuse=False)
    credit_count, ours = count_parameters(kind, values)
    overrides = model_overrides(kind, values)
    post_blocks, post_ignored = [], []
    if not refused:
        post_blocks, post_ignored = post_conf_overrides(section, config.get("data"), Path(credit_config).parent)
    lines = [f"CREDIT config: {credit_config}",
             f"model.type: {section['type']} -> CREDIT's {CREDIT_CLASSES[kind]}, built here as model={kind}",
             f"parameters: {credit_count:,} as CREDIT counts them"
             + (f" ({ours:,} here: CREDIT also builds a cube_embedding it never calls at patch size 1)"
                if ours != credit_count else "")]
    lines += [f"model.{key}: ignored, as CREDIT ignores it" for key in [*ignored_keys(section), *post_ignored]]
    lines += [f"refused: {line}" for line in refused]
    if post_blocks and isinstance(config.get("data"), Mapping) and "source" in config["data"]:
        lines.append(f"note: {GEN2_POST_CONF}")
    if post_blocks:
        active = sorted(name for names in active_fixers(section["post_conf"]) for name in names)
        lines.append(f"post blocks: {', '.join(active)} (CREDIT's post_conf, as model.post_conf)")
    lines.append("model overrides: " + " ".join([*overrides, *post_blocks]))
    return lines, refused, [*overrides, *post_blocks]


def convert_credit_checkpoint(credit_config: str | Path, source: str | Path, out: str | Path,
                              extra_overrides: Sequence[str] = ()) -> list[str]:
    """Write OUT; return the overrides a run needs to build the same model.

    Refuses an existing OUT (FileExistsError, nothing written); writes a sibling partial
    directory and renames it into place, so a failed conversion leaves no OUT.
    """
    source, out = Path(source), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; refusing to overwrite it (choose a new path)")
    if not source.is_file():
        raise FileNotFoundError(f"CREDIT checkpoint {source} is not a file")
    config = read_credit_config(credit_config)
    section = read_credit_model_section(config)
    kind, values = resolve_credit_model(section)
    post_blocks, post_ignored = post_conf_overrides(section, config.get("data"), Path(credit_config).parent)
    if post_ignored:
        log.warning("CREDIT's post blocks do not read %s; neither does credit", ", ".join(f"model.{k}" for k in post_ignored))
    if post_blocks and isinstance(config.get("data"), Mapping) and "source" in config["data"]:
        log.warning("%s", GEN2_POST_CONF)
    overrides = [*model_overrides(kind, values), *post_blocks]
    cfg = compose_config([*overrides, *extra_overrides])  # validates the keys as a run will
    model = build_credit_model(kind, values)
    load_credit_weights(model, read_credit_state_dict(source), str(source))
    partial = out.with_name(f".partial_{out.name}")
    if partial.exists():
        shutil.rmtree(partial)
    state = {"model": model.state_dict(), "config": OmegaConf.to_yaml(cfg), "source": str(source.resolve())}
    with _quiet_single_process():
        dcp.save(state, checkpoint_id=str(partial))
    (partial / OVERRIDES_FILE).write_text(" ".join(overrides) + "\n")
    partial.rename(out)
    log.info("converted CREDIT %s checkpoint %s into weights-only DCP checkpoint %s", kind, source, out)
    return overrides
