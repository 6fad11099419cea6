"""`t1 config check FILE` and `t1 config show FILE`: validate a config, print it with defaults filled in."""

from __future__ import annotations

import argparse
import json

from t1.cli.common import EXIT_BAD_CONFIG, print_config_error
from t1.config import ConfigError, load_config


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", help="Check and show config files.")
    cmds = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = cmds.add_parser("check", help="Validate config files; exit 0 if all are valid, 2 otherwise.")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    check.set_defaults(func=_check)
    show = cmds.add_parser("show", help="Print the effective config (defaults filled in) as JSON.")
    show.add_argument("file", nargs="?", metavar="FILE")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    show.set_defaults(func=_show)
    ref = cmds.add_parser("reference", help="Print the configuration reference (Markdown) generated from the schema.")
    ref.set_defaults(func=_reference)


def _check(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            load_config(path, args.overrides)
        except ConfigError as err:
            print_config_error(err)
            status = EXIT_BAD_CONFIG
        else:
            print(f"ok: {path}")
    return status


def _show(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.file, args.overrides)
    except ConfigError as err:
        print_config_error(err)
        return EXIT_BAD_CONFIG
    print(json.dumps(cfg.model_dump(mode="json"), indent=2))
    return 0


def _reference(args: argparse.Namespace) -> int:
    from t1.config.reference import reference_markdown

    print(reference_markdown())
    return 0
