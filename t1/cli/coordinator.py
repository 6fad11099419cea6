"""`t1-coordinator --config FILE [--set k=v]`: the control plane (training run, eval jobs, local stack).

The config is validated first (exit 2 naming each bad key); torch, transformers and the other
heavy imports happen only after that, inside the coordinator.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from t1.cli.common import add_config_args, config_or_exit, run_service


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-coordinator", description="Run the T1 coordinator.")
    add_config_args(parser, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_or_exit(args)
    # The embedded sandbox server forks for every session; gRPC's fork handlers would log each fork.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from t1.logsetup import setup_logging

    setup_logging(cfg.logging, "t1-coordinator")
    from t1.coordinator.app import Coordinator

    coordinator = Coordinator(cfg, args.config, list(args.overrides))
    return run_service(coordinator.run())


if __name__ == "__main__":
    sys.exit(main())
