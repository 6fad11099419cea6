"""`t1-coordinator --config FILE [--set k=v] [--fresh | --resume]`: the control plane (training run, eval jobs,
local stack).

The config is validated first (exit 2 naming each bad key); torch, transformers and the other
heavy imports happen only after that, inside the coordinator. A training run then picks its run
directory by the run-again rule (t1.coordinator.run.run_dirs) and says on its first line whether it
starts fresh or resumes; a run the rule refuses exits 3 with the reason. A training run logs every
record to <run_dir>/logs/coordinator.log; the terminal gets the progress view, stage lines and warnings.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from t1.cli.common import EXIT_BAD_STATE, add_config_args, config_or_exit, run_service
from t1.config.schema import T1Config
from t1.coordinator.run.run_dirs import (
    TRAINER_SUBDIR,
    RunChoice,
    RunDirError,
    RunMode,
    choose,
    choose_fixed,
    first_line,
)
from t1.workdir import DirectoryBusy, DirLock


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-coordinator", description="Run the T1 coordinator.")
    add_config_args(parser, required=True)
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--fresh", action="store_true",
                       help="Start a new numbered run even if the newest one is unfinished (needs "
                            "coordinator.runs_dir).")
    again.add_argument("--resume", action="store_true",
                       help="Resume the newest run; refused when it has finished or there is none.")
    return parser


def select_run(cfg: T1Config, mode: RunMode) -> tuple[RunChoice, list[str]]:
    """The run directory of a training run, and the overrides that put this run (and a trainer this
    coordinator starts) in it; RunDirError when the rule refuses."""
    local_trainer = not cfg.trainer.endpoint
    runs_dir = cfg.coordinator.runs_dir
    if runs_dir is None:
        trainer_dir = cfg.trainer.work_dir if local_trainer else None
        return choose_fixed(cfg.coordinator.run_dir, trainer_dir, mode), []
    choice = choose(runs_dir, cfg.name, mode, local_trainer)
    overrides = [f"coordinator.run_dir={choice.path}"]
    if local_trainer:
        overrides.append(f"trainer.work_dir={choice.path / TRAINER_SUBDIR}")
    return choice, overrides


def total_steps(cfg: T1Config) -> int:
    ws = cfg.trainer.warm_start
    return ws.sft_steps + ws.critic_warmup_steps + cfg.trainer.max_steps


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_or_exit(args)
    overrides = list(args.overrides)
    log_file: Path | None = None
    if cfg.coordinator.train:
        mode = RunMode.FRESH if args.fresh else RunMode.RESUME if args.resume else RunMode.AUTO
        try:
            choice, extra = select_run(cfg, mode)
        except RunDirError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_STATE
        try:  # refused here, before the first line, when another coordinator runs it (app.py holds it after)
            DirLock(choice.path, "t1-coordinator").acquire().release()
        except DirectoryBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_STATE
        if extra:
            overrides += extra
            args.overrides = overrides
            cfg = config_or_exit(args)
        print(first_line(choice, total_steps(cfg)), flush=True)
        log_file = cfg.coordinator.run_dir / "logs" / "coordinator.log"
    elif args.fresh or args.resume:
        print("error: --fresh and --resume choose a training run's directory; this config serves eval jobs only "
              "(coordinator.train: false)", file=sys.stderr)
        return EXIT_BAD_STATE
    # The embedded sandbox server forks for every session; gRPC's fork handlers would log each fork.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from t1.logsetup import setup_logging

    setup_logging(cfg.logging, "t1-coordinator", log_file)
    from t1.coordinator.run.app import Coordinator

    coordinator = Coordinator(cfg, args.config, overrides)
    return run_service(coordinator.run())


if __name__ == "__main__":
    sys.exit(main())
