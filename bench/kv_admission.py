"""Static episode caps against admission by KV headroom, on a simulated server with a KV capacity.

Episodes whose contexts grow turn by turn (each turn: the server's reply plus `--tool-tokens` of
tool output, a `--pause-ms` tool pause between turns, `--min-turns`-`--turns` turns) run through the
real `InferencePool` over gRPC against `bench.sim_inference` with `--kv-capacity-tokens` (in this
process). A static cap of K concurrent episodes (the rollout's `max_concurrent_episodes`) either
leaves the KV cache idle early or overcommits it late (the server drops idle sessions' caches and
their next turns prefill everything again); `kv` admits by headroom under the largest cap
(`inference.pool.kv_admission`, `--expected-context-tokens` its prior, t1/inference/client/kv_admission.py).

Per setting: turns/s, time waiting for admission (an episode slot, or KV room), prompt tokens
prefilled (recomputed after evictions included), evictions, and KV use over time (sampled through
GetModelInfo), plotted to `--plot` (the first repeat). A run's course depends on timing (which turn
finishes first decides who is evicted), so `--repeats` runs every setting again and the summary
gives each setting's mean, least and most turns/s::

    python -m bench.kv_admission --episodes 24 --caps 2,8 --repeats 3 --out bench/results/kv_admission_cpu.json \\
        --plot bench/results/kv_admission_cpu.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine_info import machine
from bench.sim_inference import Latency, SimInferenceServicer, binding
from bench.sim_replies import ModelShape, ReplyBook, ReplySettings
from t1.config.inference import InferencePoolConfig
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.client.pool import InferencePool
from t1.inference.types import GenerateRequest, SamplingParams
from t1.rpc.server import GrpcServer


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=Path(".t1/models/tiny"), help="model folder (its tokenizer)")
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--turns", type=int, default=12, help="most turns of an episode")
    p.add_argument("--min-turns", type=int, default=2, help="fewest turns (each episode draws its count)")
    p.add_argument("--expected-context-tokens", type=int, default=0,
                   help="kv: inference.pool.kv_expected_context_tokens (0: each turn's own need)")
    p.add_argument("--caps", default="2,8", help="static caps to compare; kv runs under the largest")
    p.add_argument("--kv-capacity-tokens", type=int, default=20000)
    p.add_argument("--prompt-tokens", type=int, default=500)
    p.add_argument("--tool-tokens", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=200, help="reply length bound (sampling.max_tokens)")
    p.add_argument("--pause-ms", type=float, default=100.0)
    p.add_argument("--per-request-ms", type=float, default=20.0)
    p.add_argument("--per-token-ms", type=float, default=2.0)
    p.add_argument("--per-prefill-token-ms", type=float, default=0.1)
    p.add_argument("--sample-s", type=float, default=0.25)
    p.add_argument("--repeats", type=int, default=1, help="runs of every setting (the summary: mean, least, most)")
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path)
    return p.parse_args(argv)


async def _episode(pool: InferencePool, name: str, args: argparse.Namespace, rng: np.random.Generator,
                   turns: list[int]) -> None:
    context = rng.integers(16, 1000, args.prompt_tokens).astype(np.int32)
    for turn in range(int(rng.integers(args.min_turns, args.turns + 1))):
        res = await pool(GenerateRequest(name, context, SamplingParams(seed=turn, max_tokens=args.max_tokens),
                                         return_routing=False))
        turns.append(1)
        await asyncio.sleep(args.pause_ms / 1e3)
        context = np.concatenate([context, res.token_ids, rng.integers(16, 1000, args.tool_tokens).astype(np.int32)])
    pool.end_session(name)


async def run_setting(args: argparse.Namespace, cap: int, kv: bool) -> dict[str, Any]:
    tokenizer = args.model / "tokenizer.json"
    book = ReplyBook(tokenizer, ReplySettings(min(50, args.max_tokens), args.max_tokens))
    latency = Latency(args.per_request_ms / 1e3, args.per_prefill_token_ms / 1e3, args.per_token_ms / 1e3, 0)
    sim = SimInferenceServicer(book, ModelShape(4, 8, 2, vocab_size=book.vocab_size), latency,
                               kv_capacity_tokens=args.kv_capacity_tokens)
    server = GrpcServer([binding(sim)], ServerConfig(port=0, grace_s=0.2), AuthConfig())
    await server.start()
    pool = InferencePool(
        InferencePoolConfig(
            kv_admission=kv, request_timeout_s=600, stall_s=0, kv_expected_context_tokens=args.expected_context_tokens
        ),
        [server.address],
    )
    slots = asyncio.Semaphore(cap)
    slot_wait = [0.0]
    turns: list[int] = []
    samples: list[tuple[float, int]] = []
    rng = np.random.default_rng(0)
    t0 = time.monotonic()

    async def one(i: int) -> None:
        w = time.monotonic()
        async with slots:
            slot_wait[0] += time.monotonic() - w
            await _episode(pool, f"e{i}", args, np.random.default_rng(int(rng.integers(1 << 30))), turns)

    async def sample() -> None:
        while True:
            info = await pool._replicas[0].transport.info(30.0)
            samples.append((time.monotonic() - t0, int(info.kv_used_tokens)))
            await asyncio.sleep(args.sample_s)

    sampler = asyncio.create_task(sample())
    await asyncio.gather(*(one(i) for i in range(args.episodes)))
    wall = time.monotonic() - t0
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)
    kv_wait = pool.metrics.registry.get_sample_value("t1_inference_kv_wait_seconds_total") or 0.0
    await pool.close()
    await server.stop()
    used = [u for _, u in samples]
    return {
        "setting": f"kv admission (cap {cap})" if kv else f"static cap {cap}", "cap": cap, "kv_admission": kv,
        "wall_s": round(wall, 2), "turns": len(turns), "turns_per_s": round(len(turns) / wall, 3),
        "admission_wait_s": round(slot_wait[0] + kv_wait, 2), "slot_wait_s": round(slot_wait[0], 2),
        "kv_wait_s": round(kv_wait, 2), "prefilled_tokens": sim.prefilled_tokens, "evictions": sim.kv_evictions,
        "kv_use_mean": round(float(np.mean(used)) / args.kv_capacity_tokens, 3) if used else 0.0,
        "kv_use_over_time": samples,
    }


def plot(results: list[dict[str, Any]], capacity: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        t = [s[0] for s in r["kv_use_over_time"]]
        u = [s[1] / capacity for s in r["kv_use_over_time"]]
        ax.plot(t, u, label=f"{r['setting']}: {r['turns_per_s']} turns/s")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("seconds")
    ax.set_ylabel("KV use / capacity")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def amain(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every setting once per repeat, the settings interleaved (a slower stretch of the machine hits all)."""
    caps = sorted(int(c) for c in args.caps.split(","))
    results = []
    for repeat in range(args.repeats):
        for cap, kv in [(cap, False) for cap in caps] + [(caps[-1], True)]:
            result = await run_setting(args, cap, kv)
            results.append({"repeat": repeat, **result})
            print(json.dumps({k: v for k, v in results[-1].items() if k != "kv_use_over_time"}), flush=True)
    return results


def summary(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per setting over its repeats: turns/s (mean, least, most) and the means of the waits and prefill."""
    out: dict[str, dict[str, Any]] = {}
    for setting in dict.fromkeys(r["setting"] for r in results):
        runs = [r for r in results if r["setting"] == setting]
        rates = [r["turns_per_s"] for r in runs]
        out[setting] = {"runs": len(runs), "turns_per_s": round(float(np.mean(rates)), 3),
                        "turns_per_s_min": min(rates), "turns_per_s_max": max(rates),
                        **{key: round(float(np.mean([r[key] for r in runs])), 3)
                           for key in ("admission_wait_s", "prefilled_tokens", "evictions", "kv_use_mean")}}
    return out


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    from bench.load.run import ensure_model

    ensure_model(args.model)
    results = asyncio.run(amain(args))
    table = summary(results)
    for setting, row in table.items():
        print(json.dumps({"setting": setting, **row}))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "settings": settings, "summary": table,
                                        "results": results}, indent=1) + "\n")
    if args.plot:
        plot([r for r in results if r["repeat"] == 0], args.kv_capacity_tokens, args.plot)


if __name__ == "__main__":
    main()
