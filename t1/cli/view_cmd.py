"""`t1 view RUN_DIR [--port P]`: serve the read-only web viewer of a run directory on a loopback port."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="Serve a read-only web viewer of a run directory (curves, episodes, tokens).")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="The coordinator's run_dir (holds run.jsonl).")
    p.add_argument("--port", type=int, default=8470, help="Port to listen on; 0 picks a free one (default 8470).")
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
    p.add_argument("--allow-host", dest="allow_hosts", action="append", default=[], metavar="NAME",
                   help="A Host header to answer besides localhost, the loopback addresses and --host (repeatable; "
                        "the name a browser uses to reach a viewer bound beyond loopback).")
    p.add_argument("--trainer-dir", type=Path, default=None,
                   help="The trainer's work_dir (its buffer.sqlite); default: found from the run log.")
    p.add_argument("--model", type=Path, default=None,
                   help="Model folder whose tokenizer names the tokens; default: the latest published weights.")
    p.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        print(f"t1 view: RUN_DIR {run_dir} is not a directory", file=sys.stderr)
        return 2
    if not (run_dir / "run.jsonl").is_file() and not (run_dir / "spool").is_dir():
        print(f"t1 view: {run_dir} holds neither run.jsonl nor spool/: not a T1 run directory", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"t1 view: --port {args.port} is not a port number (0-65535)", file=sys.stderr)
        return 2
    import uvicorn

    from t1.view.index import RunIndex, RunPaths
    from t1.view.server import create_app
    from t1.view.vocab import load_vocab

    index = RunIndex(RunPaths(run_dir.resolve(), args.trainer_dir.resolve() if args.trainer_dir else None))
    vocab = load_vocab(args.model or _latest_weights(index))
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"t1 view: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 2
    sock.listen(128)  # connections made before uvicorn's loop runs wait in the backlog
    host, port = sock.getsockname()[:2]
    print(f"t1 view: {len(index.episodes)} episodes of {run_dir} at http://{host}:{port}/", flush=True)
    app = create_app(index, vocab, hosts=[args.host, *args.allow_hosts])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
    return 0


def _latest_weights(index) -> Path | None:
    """The newest published weights folder named in the run log that still exists (it has the tokenizer)."""
    for r in reversed(index.records):
        if r.get("event") == "weights" and r.get("path") and Path(r["path"]).is_dir():
            return Path(r["path"])
    return None
