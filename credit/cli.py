"""The `credit` command: train | rollout | check | plan | convert-checkpoint | data generate|stats | sdc-probe."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

USAGE = """credit <command> [args]

commands:
  train [--nproc N] [--credit-config CREDIT.yml] [KEY=VALUE ...]
                                 train with hydra overrides, e.g. trainer.max_steps=50 run_dir=/tmp/run;
                                 --nproc N launches N local ranks (e.g. parallelism=fsdp2_tp2);
                                 --credit-config: a CREDIT config file as CREDIT reads it (docs/credit_config.md)
  rollout [--nproc N] [--credit-config CREDIT.yml] [KEY=VALUE ...]
                                 forecasts from a checkpoint of the run (same overrides as train, plus
                                 rollout.*), e.g. rollout.init_times=[2001-01-01T00] rollout.lead_steps=8
  check [KEY=VALUE ...]          compose and validate the config, print it, run nothing
  check --credit-config CREDIT.yml [KEY=VALUE ...]
                                 read a CREDIT config as CREDIT reads it: the model's CREDIT class and
                                 parameter count (built on the meta device), what every data, trainer,
                                 loss and predict key became (or why it is ignored or refused), then
                                 the resolved config
  plan [--gpus 1,2,4,8] [--gpu-memory 80] [--global-batch B] [--grid NLATxNLON]
       [--credit-config CREDIT.yml] [KEY=VALUE ...]
                                 per-rank memory and communication of every (dp, tp, sequence-parallel,
                                 FSDP2/DDP) layout on N GPUs, traced under fake tensors (nothing runs
                                 for real); the layouts that fit (credit plan --help)
  convert-checkpoint --credit-config CREDIT.yml CHECKPOINT.pt OUT [KEY=VALUE ...]
                                 write a checkpoint of NCAR CREDIT (its trainer's file, a bare or
                                 DDP/FSDP-prefixed state dict) as a weights-only DCP checkpoint OUT
                                 (new path) for the model CREDIT.yml's model: section describes;
                                 prints the model overrides to continue with:
                                 credit train trainer.resume=OUT model=... KEY=VALUE ...
  convert-checkpoint IN OUT [KEY=VALUE ...]
                                 the same for a single-file checkpoint of the model the overrides
                                 describe
  data generate --out DIR [...]  write the synthetic ERA5-layout dataset (see --help)
  data generate --like CREDIT.yml --out DIR [--grid HxW]
                                 data in a CREDIT gen2 file's layout and a copy of the file
  data stats [--overwrite] [KEY=VALUE ...]
                                 write data.files.mean / data.files.std under data.root from
                                 data.train_period (same overrides as train; --help)
  sdc-probe [--nproc N] [--layers 8] [--dim 64] [--iterations 10] [KEY=VALUE ...]
                                 qualify ranks for silent data corruption: identical layers under
                                 FSDP2 + TP (e.g. trainer.parallelism.tensor=2, model.gemm=...,
                                 diagnostics.sdc.inject.*); per-layer, per-rank table; exit 1 on
                                 any mismatch

Every failure prints one `error:` line (exit 2; an SDC stop exits 3). --debug (or
CREDIT_DEBUG=1) shows the traceback of an unexpected one.
"""

PROBE_FLAGS = {"--layers": 8, "--dim": 64, "--iterations": 10}


_WORKER_ERROR = re.compile(r"Caught \w+ in (DataLoader worker process \d+)\.\nOriginal Traceback")


def _one_line(message: str) -> str:
    """`message`, or for an error torch's DataLoader re-raised from a worker (the worker's
    whole traceback as the message) the worker's own one-line message and which worker."""
    worker = _WORKER_ERROR.match(message)
    if worker is None:
        return message
    last = message.rstrip().splitlines()[-1]  # "package.ErrorType: the message"
    return f"{last.split(': ', 1)[-1]} (in {worker.group(1)})"


def _fail(message: str, every_rank: bool = True) -> int:
    """One `error:` line and exit code 2. An error every rank reaches alike (a config value)
    is printed by rank 0 only (`every_rank=False`)."""

    if every_rank or os.environ.get("RANK", "0") == "0":
        print(f"error: {_one_line(message)}", file=sys.stderr)
    return 2


def _split_nproc(args: Sequence[str]) -> tuple[int | None, list[str]]:
    rest = list(args)
    for i, arg in enumerate(rest):
        if arg == "--nproc" or arg.startswith("--nproc="):
            value = arg.split("=", 1)[1] if "=" in arg else (rest[i + 1] if i + 1 < len(rest) else "")
            del rest[i : i + (1 if "=" in arg else 2)]
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"--nproc {value!r} must be a whole number >= 1")
            return int(value), rest
    return None, rest


DEBUG_ENV = "CREDIT_DEBUG"  # 1: an unexpected error shows its traceback (also --debug)
LOST_PEER = 4  # a rank's exit code when a collective failed because another rank's process ended
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")  # gloo's transport


# A launched rank's config: the one its launcher composed and checked (`_launch`), so every
# rank runs that very config and none composes it again (about half a second of CPU each).
_LAUNCHED_CONFIG = None


def _rank_main(cfg, args: list[str]) -> int:
    """A launched rank's entry point: `main(args)` with the launcher's composed config."""
    global _LAUNCHED_CONFIG
    _LAUNCHED_CONFIG = cfg
    return main(args)


def _launch(nproc: int, overrides: Sequence[str], command_name: str = "train", cfg=None) -> int:
    """Run `credit <command_name>` as `nproc` local ranks (same overrides; `credit.launch`)
    and exit with the ranks' own exit code (an SDC stop is 3, a config error 2). With `cfg`
    (the config the overrides composed to), the ranks run it instead of composing their own."""
    from functools import partial

    from credit.launch import LaunchStopped, launch

    entry = main if cfg is None else partial(_rank_main, cfg)
    try:
        succeeded, ranks = launch(nproc, entry, [command_name, *overrides],
                                 debug=os.environ.get(DEBUG_ENV) == "1")
    except LaunchStopped as stop:  # a scheduler's SIGTERM, ^C: the shell's code for that signal
        _fail(f"the launch got {stop}; its {nproc} ranks were stopped")
        sys.exit(128 + stop.signum)
    failed = [code for code in ranks if code and code != LOST_PEER]
    finished = [code for code in ranks if code != LOST_PEER]
    if not succeeded and len(ranks) == nproc and not any(ranks):
        # every rank finished its work and left its process group, then one aborted in its
        # exit (gloo's threads: "terminate called without an active exception"): nothing of
        # the run is lost
        print(f"warning: all {nproc} ranks finished with exit code 0; a rank then aborted while it "
              f"exited, which changes nothing of the result", file=sys.stderr)
        sys.exit(0)
    if not succeeded and not failed:  # a rank died before it could say why (killed, crashed); the
        # others were stopped, or lost it in a collective (LOST_PEER: a warning each)
        _fail(f"{len(finished)} of {nproc} ranks finished; the launch failed without an error "
              f"line from a rank (--debug shows the launcher's report)")
        sys.exit(2)
    sys.exit(max(failed) if failed else 0)


def _compose_or_launch(args: Sequence[str], command_name: str):
    """Compose and validate the config (and the layout for --nproc N); with N > 1, re-run
    the command as N local ranks (credit.launch), which does not return. Returns (exit code, cfg):
    a non-None exit code means stop with it."""
    from credit.config import ConfigError, compose_config
    from credit.interop.command_line import credit_file_overrides

    if _LAUNCHED_CONFIG is not None:  # a launched rank: its launcher composed the config
        return None, _LAUNCHED_CONFIG
    try:
        nproc, overrides = _split_nproc(args)
        if nproc is not None and nproc > 1:  # its imports overlap composing and checking here
            from credit.launch import start_forkserver

            start_forkserver()
        overrides, _ = credit_file_overrides(overrides)
        cfg = compose_config(overrides)
        if nproc is not None:
            from credit.parallel.mesh import resolve_layout

            par = cfg.trainer.parallelism
            resolve_layout(nproc, par.data, par.tensor, par.ensemble)
    except (ConfigError, ValueError) as error:
        return _fail(str(error)), None
    if nproc is not None and nproc > 1:
        _launch(nproc, overrides, command_name, cfg)
    return None, cfg


def _train(args: Sequence[str]) -> int:
    code, cfg = _compose_or_launch(args, "train")
    if code is not None:
        return code
    from credit.checkpoint import CheckpointError
    from credit.checkpoint.resume import RunDirHoldsRun
    from credit.config import ConfigError
    from credit.data import DataError
    from credit.diagnostics import SDCError
    from credit.train import run_training
    from credit.train.run_lock import RunDirInUse

    try:
        run_training(cfg)
    except (ConfigError, FloatingPointError, RunDirInUse, RunDirHoldsRun, NotADirectoryError) as error:  # the same on every rank
        return _fail(str(error), every_rank=False)
    except (DataError, CheckpointError, FileExistsError, FileNotFoundError) as error:
        return _fail(str(error))
    except SDCError as error:  # the run's checks found corrupted data: exit 3, not a usage error
        _fail(str(error), every_rank=False)  # every rank reached the same verdict
        return 3
    return 0


def _rollout(args: Sequence[str]) -> int:
    code, cfg = _compose_or_launch(args, "rollout")
    if code is not None:
        return code
    from credit.checkpoint import CheckpointError
    from credit.config import ConfigError
    from credit.data import DataError
    from credit.rollout import RolloutError, run_rollout

    try:
        run_rollout(cfg)
    except (ConfigError, DataError, CheckpointError, RolloutError, FileExistsError, FileNotFoundError) as error:
        return _fail(str(error))
    return 0


def _check(overrides: Sequence[str]) -> int:
    from omegaconf import OmegaConf

    from credit.config import ConfigError, compose_config
    from credit.interop.command_line import credit_file_overrides

    try:
        overrides, credit_lines = credit_file_overrides(overrides, report=True)
        cfg = compose_config(overrides)
    except (ConfigError, ValueError) as error:  # CreditCheckpointError (the file) is a ValueError
        return _fail(str(error))
    if credit_lines:
        print("\n".join(credit_lines))
        print("# the resolved config")
    print(OmegaConf.to_yaml(cfg), end="")
    print("config OK", file=sys.stderr)
    return 0


def _plan(args: Sequence[str]) -> int:
    from credit.config import ConfigError
    from credit.plan import main as plan_main

    try:
        return plan_main(args)
    except (ConfigError, ValueError, FileExistsError, FileNotFoundError) as error:
        return _fail(str(error))


def _convert(args: Sequence[str]) -> int:
    credit_config = None
    if args[:1] == ["--credit-config"]:
        if len(args) < 2:
            return _fail("usage: credit convert-checkpoint --credit-config CREDIT.yml CHECKPOINT.pt OUT [KEY=VALUE ...]")
        credit_config, args = args[1], args[2:]
    if len(args) < 2 or any("=" in a for a in args[:2]):
        return _fail("usage: credit convert-checkpoint [--credit-config CREDIT.yml] IN OUT [KEY=VALUE ...]")
    source, out, overrides = args[0], args[1], args[2:]
    if Path(out).exists():  # before any work: nothing is written
        return _fail(f"{out} already exists; refusing to overwrite it (choose a new path)")
    from credit.config import ConfigError, compose_config
    from credit.logs import configure_logging

    configure_logging()
    if credit_config is not None:
        from credit.interop.checkpoint_import import convert_credit_checkpoint

        try:
            model_overrides = convert_credit_checkpoint(credit_config, source, out, overrides)
        except (ConfigError, ValueError, FileExistsError, FileNotFoundError) as error:
            return _fail(str(error))
        print(f"wrote {out}; continue with:\n  credit train trainer.resume={out} {' '.join(model_overrides)} "
              f"KEY=VALUE ...\n(the model overrides are also in {Path(out) / 'credit_overrides.txt'})")
        return 0
    try:
        cfg = compose_config(overrides)
    except ConfigError as error:
        return _fail(str(error))
    from credit.checkpoint.weights import convert_checkpoint

    try:
        convert_checkpoint(source, out, cfg)
    except (ValueError, FileExistsError, FileNotFoundError) as error:  # ValueError: data, remap, fit
        return _fail(str(error))
    print(f"wrote {out}; continue with: credit train trainer.resume={out} ...")
    return 0


def _probe(args: Sequence[str]) -> int:
    from credit.config import ConfigError, compose_config

    try:
        nproc, rest = _split_nproc(args)
        sizes, overrides = dict(PROBE_FLAGS), []
        words = iter(rest)
        for word in words:
            flag, _, value = word.partition("=")
            if flag in sizes:
                value = value or next(words, "")
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"{flag} {value!r} must be a whole number >= 1")
                sizes[flag] = int(value)
            else:
                overrides.append(word)
        cfg = compose_config(["run_dir=runs/sdc-probe", *overrides, "trainer.parallelism.data=fsdp2",
                              "diagnostics.sdc.enabled=true", "diagnostics.sdc.every_n_steps=1",
                              "diagnostics.sdc.action=warn"])
        from credit.parallel.mesh import launched_world_size

        world, tensor = nproc or launched_world_size(), cfg.trainer.parallelism.tensor
        # every check the layout can run: comm needs more than one rank, replica tp > 1
        cfg.diagnostics.sdc.checks = (["comm"] if world > 1 else []) + \
            (["replica"] if tensor > 1 else []) + ["compute"]
        if nproc is not None:
            from credit.parallel.mesh import resolve_layout

            resolve_layout(nproc, "fsdp2", cfg.trainer.parallelism.tensor)
    except (ConfigError, ValueError) as error:
        return _fail(str(error))
    flags = [f"{k}={v}" for k, v in sizes.items()]
    if nproc is not None and nproc > 1:
        _launch(nproc, [*flags, *overrides], "sdc-probe")
    from credit.diagnostics.probe import run_probe
    from credit.logs import configure_logging
    from credit.parallel.runtime import launched_rank

    configure_logging(rank=launched_rank())
    try:
        return run_probe(cfg, sizes["--layers"], sizes["--dim"], sizes["--iterations"])
    except (ConfigError, ValueError) as error:
        return _fail(str(error))


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; every failure ends in one `error:` line and exit status 2 (3: an SDC
    stop). An error no command expects is reported the same way, named by its type, unless
    `--debug` or CREDIT_DEBUG=1 asks for the traceback."""

    args = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in args:
        args.remove("--debug")
        os.environ[DEBUG_ENV] = "1"  # launched ranks inherit it
    try:
        return _dispatch(args)
    except Exception as error:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        return unexpected_error(error)


def unexpected_error(error: Exception) -> int:
    """An error no command expects: one `error:` line naming its type, exit code 2; on one rank
    of several, a collective that failed because another rank's process ended is a warning
    and LOST_PEER (the cause is that rank's, which its launcher names)."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else "(no message)"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and any(s in text for s in _PEER_GONE):
        print(f"warning: rank {os.environ.get('RANK', '?')}: a collective stopped because another rank's "
              f"process ended ({type(error).__name__}: {first[:160]})", file=sys.stderr)
        return LOST_PEER
    return _fail(f"{type(error).__name__}: {first} (--debug or {DEBUG_ENV}=1 shows the traceback)")


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command in ("train", "rollout", "check", "convert-checkpoint", "sdc-probe") and (
            "-h" in rest or "--help" in rest):
        print(USAGE, end="")  # before hydra, whose override parser would reject the flag
        return 0
    if command == "train":
        return _train(rest)
    if command == "rollout":
        return _rollout(rest)
    if command == "check":
        return _check(rest)
    if command == "plan":
        return _plan(rest)
    if command == "convert-checkpoint":
        return _convert(rest)
    if command == "sdc-probe":
        return _probe(rest)
    if command == "data":
        if rest[:1] == ["generate"]:
            from credit.data.generate_command import main as generate_main

            return generate_main(rest[1:])
        if rest[:1] == ["stats"]:
            from credit.data.stats import main as stats_main

            return stats_main(rest[1:])
        return _fail("usage: credit data generate --out DIR [...] | credit data stats [--overwrite] "
                     "[KEY=VALUE ...]")
    return _fail(
        f"unknown command {command!r}; commands: train, rollout, check, plan, convert-checkpoint, "
        f"data generate, data stats, sdc-probe"
    )


if __name__ == "__main__":
    sys.exit(main())
