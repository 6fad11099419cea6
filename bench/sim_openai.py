"""A simulated OpenAI-compatible /v1/completions server (vLLM's fields), no model: the HTTP face of
bench/sim_inference.py's replies (real tokenized tool calls from the same ReplyBook, a fixed latency
per request), so a peer-style client and T1's gRPC client are measured against the same turns::

    python -m bench.sim_openai --tokenizer .t1/bench/tiny/tokenizer.json --ready-file P
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from pathlib import Path

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tokenizers import Tokenizer

from bench.sim_replies import CommandMix, LogprobPool, ReplyBook, ReplySettings


def make_app(book: ReplyBook, tokenizer: Tokenizer, per_request_s: float, seed: int = 0) -> Starlette:
    rng = np.random.default_rng(seed)
    logprobs = LogprobPool(seed=seed + 1)

    async def completions(request: Request) -> Response:
        body = await request.json()
        prompt = body["prompt"]
        if not isinstance(prompt, list) or not prompt:
            return JSONResponse({"error": {"message": "prompt: a non-empty list of token ids"}}, status_code=400)
        ids, _ = book.reply(rng)
        ids = ids[: int(body.get("max_tokens") or book.max_tokens)]
        lps = logprobs.take(len(ids), rng)
        await asyncio.sleep(per_request_s)
        token_list = ids.tolist()
        choice = {"index": 0, "text": tokenizer.decode(token_list, skip_special_tokens=False),
                  "finish_reason": "stop", "token_ids": token_list,
                  "logprobs": {"tokens": [f"token_id:{t}" for t in token_list], "token_logprobs": lps.tolist(),
                               "top_logprobs": None, "text_offset": []}}
        return JSONResponse({"id": "cmpl-sim", "object": "text_completion", "created": 0, "model": body["model"],
                             "choices": [choice],
                             "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                       "total_tokens": len(prompt) + len(ids)}})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--ready-file", type=Path, required=True, help="write the bound port here once serving")
    p.add_argument("--per-request-ms", type=float, default=2000.0)
    p.add_argument("--min-tokens", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=400)
    args = p.parse_args(argv)
    import uvicorn

    book = ReplyBook(args.tokenizer, ReplySettings(args.min_tokens, args.max_tokens, CommandMix.FAST))
    app = make_app(book, Tokenizer.from_file(str(args.tokenizer)), args.per_request_ms / 1e3)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    tmp = args.ready_file.with_suffix(".tmp")
    tmp.write_text(str(sock.getsockname()[1]))
    tmp.rename(args.ready_file)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                  backlog=4096)).run(sockets=[sock])


if __name__ == "__main__":
    main()
