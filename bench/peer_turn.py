"""Coordinator CPU per turn: a peer-style turn (the `openai` client, the chat template re-rendered and
re-tokenized every turn) beside T1's turn (the exact-token buffer and the gRPC pool), N sessions.

Every variant plays the same agent loop: a session's opening messages, then per turn one request, the
reply's text, the reply appended as an assistant message and a command's output as a tool message.

- `t1_grpc`: T1's TokenBuffer (prompt_ids, append_generation, append_observation) and InferencePool
  over GenerateBatched, against bench/sim_inference.py (routing 48 x top-8 returned and kept).
- `t1_openai`: the same buffer over OpenAIPool (httpx, vLLM's /v1/completions fields), against
  bench/sim_openai.py.
- `gateway`: T1's per-episode gateway (t1/gateway) serving harnesses: each session a GatewaySession behind
  its GatewayServer on a loopback port, generating through InferencePool against bench/sim_inference.py;
  the harnesses (bench/harness_driver.py, a process of its own, one keep-alive connection per harness)
  send the whole conversation every call, as OpenAI chat requests with tools. The figure is the
  gateway's CPU per request (HTTP, JSON, the template rendered with the call's tools and checked against
  the buffer, generation, the reply parsed); each round also reports the harnesses' CPU per request
  (`harness_cpu_ms_per_turn`: the load generator's, to show it is not the bound) and the segments
  started while measured (`segment_starts`).
- `peer_openai`: the conversation as messages, rendered with the tokenizer's chat template and
  tokenized again each turn, sent with `AsyncOpenAI().completions.create` (token prompt,
  `return_token_ids`), against bench/sim_openai.py: what most peer frameworks do.

Both servers are child processes with the same replies (bench/sim_replies.py) and a fixed latency
per request. The figure is this process's CPU time per completed turn, measured after every session
has done a turn; variants alternate round by round (the machine is shared and noisy)::

    .venv/bin/python bench/peer_turn.py --sessions 1000 --rounds 3 --round-s 20 --out bench/results/peer_turn_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.load.run import ensure_model, start_sim
from bench.machine_info import machine
from bench.transport import sim_args
from t1.agent.formats import FormatName, get_format
from t1.config.inference import InferencePoolConfig
from t1.config.rollout import HarnessConfig
from t1.gateway.renderers import ToolRenderers
from t1.gateway.server import GatewayServer
from t1.gateway.session import GatewaySession
from t1.inference.client.pool import InferencePool
from t1.inference.openai.openai_pool import OpenAIPool
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams
from t1.tito import ChatRenderer, TokenBuffer

VARIANTS = ("t1_grpc", "t1_openai", "gateway", "peer_openai")
INSTRUCTION = ("Fix the failing build of the project in /app: find why `make test` fails, change the code, "
               "and leave the test suite passing. ") * 8
OBSERVATION = ("total 48\ndrwxr-xr-x 1 root root 4096 Jan  1 00:00 .\n-rw-r--r-- 1 root root  812 Makefile\n"
               "-rw-r--r-- 1 root root 2210 main.c\n[exit code 0]")
MAX_TOKENS = 416
Turn = Callable[[], Awaitable[None]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every variant once")
    p.add_argument("--round-s", type=float, default=20.0, help="seconds each variant is measured per round")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--per-request-ms", type=float, default=2000.0, help="simulated latency of every request")
    p.add_argument("--model", type=Path, default=Path(".t1/bench/tiny"))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    args.variant_list = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variant_list if v not in VARIANTS]
    if unknown or not args.variant_list:
        p.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    return args


async def start_http_sim(args: argparse.Namespace, workdir: Path) -> tuple[asyncio.subprocess.Process, int]:
    ready = workdir / "http.port"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.sim_openai", "--tokenizer", str(args.model / "tokenizer.json"),
        "--ready-file", str(ready), "--per-request-ms", str(args.per_request_ms),
        cwd=str(Path(__file__).resolve().parents[1]))
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"simulated OpenAI server did not start (code {proc.returncode})")
        await asyncio.sleep(0.05)
    return proc, int(ready.read_text())


def t1_session(renderer: ChatRenderer, generate: Callable[[GenerateRequest], Awaitable[GenerateResult]],
               sid: str) -> Turn:
    """One T1 turn: the buffer's exact ids out, the sampled ids and an observation delta in."""
    fmt = get_format(FormatName.TOOL_CALLS)
    buf = TokenBuffer(renderer, fmt.first_messages(INSTRUCTION))
    eot = renderer.end_of_turn_ids
    sampling = SamplingParams(max_tokens=MAX_TOKENS)

    async def turn() -> None:
        result = await generate(GenerateRequest(sid, np.asarray(buf.prompt_ids(), np.int32), sampling))
        ids = result.token_ids.tolist()
        text = renderer.decode(ids[: len(ids) - len(eot)] if tuple(ids[-len(eot):]) == eot else ids)
        buf.append_generation(result, {"role": "assistant", "content": text})
        buf.append_observation([{"role": "tool", "content": OBSERVATION}])

    return turn


def peer_session(tokenizer: Any, client: Any) -> Turn:
    """One peer-style turn: render the whole conversation with the chat template, tokenize, complete."""
    fmt = get_format(FormatName.TOOL_CALLS)
    messages = fmt.first_messages(INSTRUCTION)

    async def turn() -> None:
        text = tokenizer.apply_chat_template(messages, tools=fmt.tools, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        completion = await client.completions.create(model="sim", prompt=ids, max_tokens=MAX_TOKENS, logprobs=0,
                                                     extra_body={"return_token_ids": True})
        messages.append({"role": "assistant", "content": completion.choices[0].text})
        messages.append({"role": "tool", "content": OBSERVATION})

    return turn


GATEWAY_KEY = "bench-gateway-key-" + "k" * 24


async def gateway_round(args: argparse.Namespace, workdir: Path, tokenizer: Any) -> dict[str, float]:
    """The `gateway` variant: N gateways here, their harnesses in bench/harness_driver.py."""
    sim, port = await start_sim(sim_args(args, 0.0), workdir)
    pool = InferencePool(InferencePoolConfig(request_timeout_s=600.0), [f"127.0.0.1:{port}"])
    base = ToolRenderers(ChatRenderer(tokenizer, end_of_turn="<|im_end|>"))  # shared, as the runner shares it
    sessions, servers, ports = [], [], []
    driver = None
    try:
        for i in range(args.sessions):
            session = GatewaySession(f"g{i}", pool, base, SamplingParams(max_tokens=MAX_TOKENS),
                                     HarnessConfig(command="bench", max_calls=1 << 30), 1 << 30, 0)
            server = GatewayServer(session, GATEWAY_KEY, "t1")
            sock = socket.create_server(("127.0.0.1", 0), backlog=16)
            ports.append(sock.getsockname()[1])
            await server.serve(sock)
            sessions.append(session)
            servers.append(server)
        (workdir / "ports.json").write_text(json.dumps(ports))
        driver = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.harness_driver", "--ports-file", str(workdir / "ports.json"),
            "--key", GATEWAY_KEY, "--instruction", INSTRUCTION, "--max-tokens", str(MAX_TOKENS),
            cwd=str(Path(__file__).resolve().parents[1]))
        while sum(s.calls > 0 for s in sessions) < args.sessions:
            if driver.returncode is not None:
                raise RuntimeError(f"gateway: the harness driver exited with {driver.returncode}")
            await asyncio.sleep(0.1)
        harnesses = psutil.Process(driver.pid)
        starts0 = sum(sum(s.causes.values()) for s in sessions)
        n0, cpu0, t0, d0 = sum(s.calls for s in sessions), time.process_time(), time.monotonic(), _cpu(harnesses)
        await asyncio.sleep(args.round_s)
        n1, cpu1, t1, d1 = sum(s.calls for s in sessions), time.process_time(), time.monotonic(), _cpu(harnesses)
        starts = sum(sum(s.causes.values()) for s in sessions) - starts0
    finally:
        if driver is not None and driver.returncode is None:
            driver.terminate()
            await driver.wait()
        for server in servers:
            await server.close()
        await pool.close()
        sim.terminate()
        await sim.wait()
    n = max(n1 - n0, 1)
    return {"turns": n1 - n0, "turns_per_s": round((n1 - n0) / (t1 - t0), 1),
            "cpu_ms_per_turn": round((cpu1 - cpu0) * 1e3 / n, 4),
            "harness_cpu_ms_per_turn": round((d1 - d0) * 1e3 / n, 4), "segment_starts": starts}


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


async def one_round(args: argparse.Namespace, variant: str, workdir: Path, tokenizer: Any,
                    renderer: ChatRenderer) -> dict[str, float]:
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    if variant == "gateway":
        return await gateway_round(args, workdir, tokenizer)
    closers: list[Callable[[], Awaitable[None]]] = []
    if variant == "t1_grpc":
        sim, port = await start_sim(sim_args(args, 0.0), workdir)
        pool = InferencePool(InferencePoolConfig(request_timeout_s=600.0), [f"127.0.0.1:{port}"])
        closers.append(pool.close)
        sessions = [t1_session(renderer, pool, f"s{i}") for i in range(args.sessions)]
    else:
        sim, port = await start_http_sim(args, workdir)
        url = f"http://127.0.0.1:{port}/v1"
        if variant == "t1_openai":
            cfg = InferencePoolConfig.model_validate({"openai": [{"base_url": url, "model": "sim",
                                                                  "max_concurrency": args.sessions,
                                                                  "request_timeout_s": 600.0}]})
            opool = OpenAIPool(cfg, vocab_size=len(tokenizer))
            closers.append(opool.close)
            sessions = [t1_session(renderer, opool, f"s{i}") for i in range(args.sessions)]
        else:
            import httpx2  # the openai client's own HTTP library

            # Keep-alive for every session, as T1's pools have (the default keeps 100 and reconnects the rest).
            http = DefaultAsyncHttpxClient(limits=httpx2.Limits(max_connections=args.sessions,
                                                                max_keepalive_connections=args.sessions))
            client = AsyncOpenAI(base_url=url, api_key="sim", max_retries=0, timeout=600.0, http_client=http)
            closers.append(client.close)
            sessions = [peer_session(tokenizer, client) for _ in range(args.sessions)]
    done = started = 0
    stop = asyncio.Event()

    async def loop(turn: Turn) -> None:
        nonlocal done, started
        first = True
        while not stop.is_set():
            await turn()
            done += 1
            started += first
            first = False

    try:
        tasks = [asyncio.create_task(loop(t)) for t in sessions]
        # Measure once every session is past its first turn (the opening prefill, the first connection).
        while started < args.sessions:
            for t in tasks:
                if t.done() and t.exception() is not None:
                    raise RuntimeError(f"{variant}: a session failed") from t.exception()
            await asyncio.sleep(0.1)
        n0, cpu0, t0 = done, time.process_time(), time.monotonic()
        await asyncio.sleep(args.round_s)
        n1, cpu1, t1 = done, time.process_time(), time.monotonic()
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for close in closers:
            await close()
        sim.terminate()
        await sim.wait()
    n = max(n1 - n0, 1)
    return {"turns": n1 - n0, "turns_per_s": round((n1 - n0) / (t1 - t0), 1),
            "cpu_ms_per_turn": round((cpu1 - cpu0) * 1e3 / n, 4)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    ensure_model(args.model)
    tokenizer: Any = AutoTokenizer.from_pretrained(str(args.model))
    renderer = ChatRenderer(tokenizer, end_of_turn="<|im_end|>", tools=get_format(FormatName.TOOL_CALLS).tools)
    rounds: dict[str, list[dict[str, float]]] = {v: [] for v in args.variant_list}
    with tempfile.TemporaryDirectory(prefix="t1-peer-turn-") as tmp:
        for r in range(args.rounds):
            for variant in args.variant_list:
                workdir = Path(tmp) / f"{variant}-{r}"
                workdir.mkdir()
                rounds[variant].append(await one_round(args, variant, workdir, tokenizer, renderer))
    summary = {v: {"cpu_ms_per_turn_median": round(statistics.median(x["cpu_ms_per_turn"] for x in rs), 4),
                   "turns_per_s_median": round(statistics.median(x["turns_per_s"] for x in rs), 1)}
               for v, rs in rounds.items()}
    base = summary.get("t1_grpc", {}).get("cpu_ms_per_turn_median")
    for s in summary.values():
        if base:
            s["cpu_ratio_vs_t1_grpc"] = round(s["cpu_ms_per_turn_median"] / base, 3)
    return {"benchmark": "peer_turn", "machine": machine(),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"},
            "rounds": rounds, "summary": summary}


def print_summary(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"coordinator CPU per turn, {out['settings']['sessions']} sessions")
    for col in ("variant", "CPU ms/turn (median)", "vs t1_grpc", "turns/s"):
        table.add_column(col, justify="right")
    for name, s in out["summary"].items():
        table.add_row(name, f"{s['cpu_ms_per_turn_median']:.3f}", str(s.get("cpu_ratio_vs_t1_grpc", "")),
                      str(s["turns_per_s_median"]))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from t1.rpc.loop import run

    out = run(main_async(args))
    print_summary(out)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
