"""Shared CLI plumbing: `--config FILE` plus `--set a.b=value`, and exit code 2 on a bad config."""

from __future__ import annotations

import argparse
import sys

from t1.config import ConfigError, T1Config, load_config

EXIT_BAD_CONFIG = 2


def add_config_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--config", metavar="FILE", required=required, help="YAML config file (see README: Configuration).")
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
