"""Client CPU per generate request: one Generate call each vs GenerateBatched (with and without linger).

Only the inference client runs here: N concurrent sessions call `InferencePool` in a loop against
`bench.sim_inference` (a child process: real gRPC, 48 x top-8 routing, a fixed latency per
request), each growing its context by the reply plus a short observation, as an agent does. The
measured figure is this process's CPU time per completed request; the variants run in alternating
rounds in one run, since the machine is shared and noisy.

    .venv/bin/python bench/transport.py --sessions 1000 --rounds 3 --round-s 20 --out bench/results/transport_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.load.run import ensure_model, start_sim
from bench.machine_info import machine
from t1.config.inference import InferencePoolConfig
from t1.inference.client.pool import InferencePool
from t1.inference.types import GenerateRequest, SamplingParams

VARIANTS = {  # name -> (batched, client linger ms, server linger ms)
    "calls": (False, 0.0, 0.0),
    "batched": (True, 0.0, 0.0),
    "batched+linger": (True, 5.0, 5.0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every variant once")
    p.add_argument("--round-s", type=float, default=20.0, help="seconds each variant runs per round")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--per-request-ms", type=float, default=2000.0, help="simulated latency of every request")
    p.add_argument("--prompt-tokens", type=int, default=1500, help="opening context of a session")
    p.add_argument("--observation-tokens", type=int, default=40, help="tokens appended after each reply")
    p.add_argument("--model", type=Path, default=Path(".t1/bench/tiny"))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    args.variant_list = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variant_list if v not in VARIANTS]
    if unknown or not args.variant_list:
        p.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    return args


def sim_args(args: argparse.Namespace, linger_ms: float) -> argparse.Namespace:
    """The simulated server's flags (bench.load.start_sim reads them): fixed latency, routing on."""
    return argparse.Namespace(model=args.model, shell="fast", min_tokens=50, max_tokens=400,
                              per_request_ms=args.per_request_ms, per_token_ms=0.0, per_prefill_token_ms=0.0,
                              chunk_tokens=64, linger_ms=linger_ms, reply_max_mb=0.0, layers=48, experts=128, top_k=8)


async def one_round(args: argparse.Namespace, variant: str, workdir: Path) -> dict[str, float]:
    batched, client_linger, server_linger = VARIANTS[variant]
    sim, port = await start_sim(sim_args(args, server_linger), workdir)
    pool = InferencePool(
        InferencePoolConfig(request_timeout_s=600.0, batched_stream=batched, batch_linger_ms=client_linger),
        [f"127.0.0.1:{port}"],
    )
    rng = np.random.default_rng(0)
    done = 0
    stop = asyncio.Event()

    async def session(i: int) -> None:
        nonlocal done
        context = rng.integers(16, 1000, size=args.prompt_tokens).astype(np.int32)
        observation = rng.integers(16, 1000, size=args.observation_tokens).astype(np.int32)
        while not stop.is_set():
            result = await pool(GenerateRequest(f"s{i}", context, SamplingParams(max_tokens=416)))
            context = np.concatenate([context, result.token_ids, observation])
            done += 1

    try:
        tasks = [asyncio.create_task(session(i)) for i in range(args.sessions)]
        # Measure once every session is past its first request (which prefills, and returns routing
        # for, its whole opening context).
        while done < 2 * args.sessions:
            await asyncio.sleep(0.1)
        n0, cpu0, t0 = done, time.process_time(), time.monotonic()
        await asyncio.sleep(args.round_s)
        n1, cpu1, t1 = done, time.process_time(), time.monotonic()
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        packing = pool.stream_stats()
    finally:
        await pool.close()
        sim.terminate()
        await sim.wait()
    n = max(n1 - n0, 1)
    out = {"requests": n1 - n0, "requests_per_s": round((n1 - n0) / (t1 - t0), 1),
           "client_cpu_ms_per_request": round((cpu1 - cpu0) * 1e3 / n, 4)}
    if packing:
        out["requests_per_message"] = round(packing["requests_sent"] / max(packing["messages_sent"], 1), 2)
        out["results_per_message"] = round(packing["results_received"] / max(packing["messages_received"], 1), 2)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    ensure_model(args.model)
    rounds: dict[str, list[dict[str, float]]] = {v: [] for v in args.variant_list}
    with tempfile.TemporaryDirectory(prefix="t1-transport-") as tmp:
        for r in range(args.rounds):
            for variant in args.variant_list:
                workdir = Path(tmp) / f"{variant}-{r}"
                workdir.mkdir()
                rounds[variant].append(await one_round(args, variant, workdir))
    summary = {}
    for variant, results in rounds.items():
        summary[variant] = {
            "client_cpu_ms_per_request_median": round(
                statistics.median(x["client_cpu_ms_per_request"] for x in results), 4
            ),
            "requests_per_s_median": round(statistics.median(x["requests_per_s"] for x in results), 1),
            **(
                {
                    "requests_per_message_median": round(
                        statistics.median(x["requests_per_message"] for x in results), 2
                    ),
                    "results_per_message_median": round(
                        statistics.median(x["results_per_message"] for x in results), 2
                    ),
                }
                if "requests_per_message" in results[0]
                else {}
            ),
        }
    base = summary.get("calls", {}).get("client_cpu_ms_per_request_median")
    for s in summary.values():
        if base:
            s["cpu_ratio_vs_calls"] = round(s["client_cpu_ms_per_request_median"] / base, 3)
    return {"benchmark": "transport", "machine": machine(),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"},
            "rounds": rounds, "summary": summary}


def print_summary(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"generate transport: {out['settings']['sessions']} sessions, client CPU per request")
    for col in ("variant", "CPU ms/request (median)", "vs calls", "requests/s", "requests / results per message"):
        table.add_column(col, justify="right")
    for name, s in out["summary"].items():
        packing = (f"{s['requests_per_message_median']} / {s['results_per_message_median']}"
                   if "requests_per_message_median" in s else "n/a")
        table.add_row(name, f"{s['client_cpu_ms_per_request_median']:.3f}", str(s.get("cpu_ratio_vs_calls", "")),
                      str(s["requests_per_s_median"]), packing)
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
