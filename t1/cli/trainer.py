"""`t1-trainer --config FILE [--set k=v] [--port P]`: serve TrainerService and train.

The config is validated (exit 2 on a bad one) before torch or DeepSpeed is imported. Rank 0 prints
`t1-trainer listening on HOST:PORT` on stdout once it accepts calls (and writes it to
<work_dir>/endpoint.json); SIGTERM or SIGINT stops it after the step in flight, with a checkpoint.
Multi-process: launch with torchrun or the deepspeed launcher; only rank 0 serves.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from t1.cli.common import (
    EXIT_BAD_CONFIG,
    add_config_args,
    config_or_exit,
    own_dir_or_exit,
    run_service,
)
from t1.config import T1Config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-trainer", description="Serve t1.v1.TrainerService and train the policy.")
    parser.add_argument("--port", type=int, help="Listen port, 0 picks one (sets trainer.server.port).")
    add_config_args(parser)
    return parser


def _config(args: argparse.Namespace) -> T1Config:
    if args.port is not None:
        args.overrides = [*args.overrides, f"trainer.server.port={args.port}"]
    return config_or_exit(args)


def _check_files(cfg: T1Config) -> None:
    """Paths the trainer needs that the schema cannot check; exit 2 naming the key."""
    problems = []
    src = cfg.trainer.policy_path or cfg.inference.model.path
    if not (src / "config.json").is_file() and (
        cfg.trainer.policy_path is not None or cfg.inference.model.init_preset is None
    ):
        key = "trainer.policy_path" if cfg.trainer.policy_path is not None else "inference.model.path"
        problems.append(f"{key}: {src} holds no model (config.json)")
    critic = cfg.trainer.critic_path
    if critic is not None and not (critic / "config.json").is_file():
        problems.append(f"trainer.critic_path: {critic} holds no model (config.json)")
    demos = cfg.trainer.warm_start.demos_path
    if demos is not None and not demos.exists():
        problems.append(f"trainer.warm_start.demos_path: {demos} does not exist")
    if problems:
        print("error: invalid config", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIG)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = _config(args)
    _check_files(cfg)
    from t1.logsetup import setup_logging

    setup_logging(cfg.logging, "t1-trainer")
    if int(os.environ.get("RANK", "0")) == 0:  # rank 0 owns the work dir until it exits; other ranks follow it
        own_dir_or_exit(cfg.trainer.work_dir, "t1-trainer", cfg.trainer.lock_wait_s)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    src = cfg.trainer.policy_path or cfg.inference.model.path
    model = cfg.inference.model
    if model.init_preset is not None:
        from t1.model.init import ensure_made

        ensure_made(src, model.init_preset, model.init_seed)
    from t1.trainer.app import serve

    return run_service(serve(cfg))


if __name__ == "__main__":
    sys.exit(main())
