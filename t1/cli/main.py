"""`t1`: the client CLI. Each sub-command group lives in its own module with a `register` function."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules under t1.cli that add a sub-command group; each defines register(subparsers).
COMMAND_MODULES = (
    "t1.cli.config_cmd",
    "t1.cli.eval_cmd",
    "t1.cli.model_cmd",
    "t1.cli.sandbox_cmd",
    "t1.cli.spool_cmd",
    "t1.cli.tasks_cmd",
    "t1.cli.view_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1", description="T1 client: configs, models, sandboxes, tasks, eval jobs "
                                                            "and the run viewer.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
