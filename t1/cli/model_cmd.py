"""`t1 model init --out DIR --preset tiny|small|learn|learn-long|qwen3-vocab --seed S`: create a random-init model
folder locally."""

from __future__ import annotations

import argparse
from pathlib import Path

from t1.model.presets import PRESETS


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("model", help="Create model folders.")
    cmds = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    init = cmds.add_parser("init", help="Write a random-init Qwen3-MoE with a locally trained tokenizer.")
    init.add_argument("--out", required=True, type=Path, metavar="DIR", help="Model folder to write.")
    init.add_argument("--preset", choices=list(PRESETS), default="tiny",
                      help="Model size (default tiny); qwen3-vocab: Qwen3's real tokenizer and chat template.")
    init.add_argument("--seed", type=int, default=0, help="Seed for the tokenizer corpus and the weights.")
    init.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    from t1.model.init import init_model

    try:
        path = init_model(args.out, args.preset, args.seed)
    except FileExistsError as err:
        print(f"error: {err}")
        return 2
    print(f"wrote {args.preset} model (seed {args.seed}) to {path}")
    return 0
