"""Shared CLI plumbing: `--config FILE` plus `--set a.b=value`, exit code 2 on a bad config, 3 on bad state."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from t1.config import ConfigError, T1Config, load_config
from t1.workdir import DirectoryBusy, DirLock, StorageError

EXIT_BAD_CONFIG = 2
EXIT_BAD_STATE = 3  # a directory another process owns, or a state file that cannot be read


def add_config_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--config", metavar="FILE", required=required, help="YAML config file (see README: "
                                                                            "Configuration).")
    parser.add_argument(
        "--set", dest="overrides", metavar="KEY.PATH=VALUE", action="append", default=[],
        help="Override one config value, e.g. --set rollout.max_turns=50 (repeatable).",
    )


def print_config_error(err: ConfigError) -> None:
    print(f"error: invalid config {err.source}", file=sys.stderr)
    for line in err.problems:
        print(f"  {line}", file=sys.stderr)


def config_or_exit(args: argparse.Namespace) -> T1Config:
    """Load the config named on the command line, or print its problems and exit 2 (no traceback)."""
    try:
        return load_config(args.config, args.overrides)
    except ConfigError as err:
        print_config_error(err)
        raise SystemExit(EXIT_BAD_CONFIG) from None


def run_service(main: Coroutine[Any, Any, int]) -> int:
    """Run a service's main coroutine; a busy directory or unreadable state file exits 3 with its message, a
    server without auth beyond loopback exits 2 with its."""
    from t1.rpc.loop import run
    from t1.rpc.server import UnprotectedServer

    try:
        return run(main)
    except (DirectoryBusy, StorageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_STATE
    except UnprotectedServer as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG


def own_dir_or_exit(directory: Path, owner: str, wait_s: float = 0.0) -> DirLock:
    """Take the directory's lock for this process (waiting up to wait_s), or print who holds it and exit 3."""
    try:
        return DirLock(directory, owner).acquire(wait_s)
    except DirectoryBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_STATE) from None
