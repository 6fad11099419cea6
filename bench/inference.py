"""Inference plane benchmark: decode and prefill tokens/s, routing capture on vs off, prefix reuse speedup,
and N concurrent sessions decoding batched vs one session per forward (the old round-robin).

Runs the torch backend in process (the same code path as t1-inference) on a random-init model.

    python bench/inference.py [--model DIR | --preset tiny|small] [--repeats 5] [--threads 1] [--out FILE]

Prints a table of medians and writes JSON with --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is not on the path

from bench.machine_info import machine


def _ids(n: int, seed: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(16, vocab, size=n).astype(np.int32)


async def _time(backend, request) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = await backend(request)
    return time.perf_counter() - t0, result


async def _concurrent(args, backend, req, vocab) -> tuple[list[float], list[float]]:
    """Decode tokens/s of args.sessions equal-length sessions at once: batched, and with max_batch 1.

    Like the single-session row, the time of the same gather with max_tokens 1 (the prefills and
    first tokens) is subtracted, so the figure is decode only.
    """
    import asyncio as aio

    async def gather_s(prompts, max_tokens) -> tuple[float, int]:
        t0 = time.perf_counter()
        results = await aio.gather(*(backend(req(p, max_tokens=max_tokens, seed=i)) for i, p in enumerate(prompts)))
        return time.perf_counter() - t0, sum(len(res.token_ids) - 1 for res in results)

    batched, round_robin = [], []
    full = backend.batcher.max_batch
    for r in range(args.repeats):
        prompts = [_ids(args.decode_prompt, 400 + 10 * r + i, vocab) for i in range(args.sessions)]
        order = [(full, batched), (1, round_robin)] if r % 2 == 0 else [(1, round_robin), (full, batched)]
        for max_batch, bucket in order:
            backend.batcher.max_batch = max_batch
            first_s, _ = await gather_s(prompts, 1)
            seconds, decoded = await gather_s(prompts, args.decode_tokens)
            bucket.append(decoded / max(seconds - first_s, 1e-9))
    backend.batcher.max_batch = full
    return batched, round_robin


async def run(args: argparse.Namespace) -> dict:
    from t1.inference.server.torch_backend import TorchBackend
    from t1.inference.types import GenerateRequest, SamplingParams

    backend = TorchBackend(args.model, capture_routing=True, max_batch=args.sessions, dtype=args.dtype,
                           device=args.device)
    vocab = backend.vocab_size
    # No EOS stop for the decode runs: every request generates exactly max_tokens.
    backend.eos_ids = ()

    def req(ids, session="", max_tokens=1, routing=True, seed=0):
        return GenerateRequest(session, ids, SamplingParams(seed=seed, max_tokens=max_tokens), return_routing=routing)

    await backend(req(_ids(32, 0, vocab), max_tokens=8))  # warm up
    prefill, decode_on, decode_off = [], [], []
    for r in range(args.repeats):
        p = _ids(args.prefill_tokens, r, vocab)
        seconds, _ = await _time(backend, req(p, max_tokens=1))
        prefill.append(args.prefill_tokens / seconds)
        short = _ids(args.decode_prompt, 100 + r, vocab)
        first, _ = await _time(backend, req(short, max_tokens=1))
        # Alternate the order so drift on a shared machine does not favour one side.
        order = [(True, decode_on), (False, decode_off)] if r % 2 == 0 else [(False, decode_off), (True, decode_on)]
        for routing, bucket in order:
            seconds, res = await _time(backend, req(short, max_tokens=args.decode_tokens, routing=routing, seed=r))
            bucket.append((len(res.token_ids) - 1) / max(seconds - first, 1e-9))
    reuse_s, full_s = [], []
    for r in range(args.repeats):
        for use_session, bucket in ((True, reuse_s), (False, full_s)):
            context = _ids(args.session_start, 200 + r, vocab)
            session = f"bench-{r}" if use_session else ""
            t0 = time.perf_counter()
            for turn in range(args.turns):
                res = await backend(req(context, session, max_tokens=args.turn_tokens, seed=turn))
                context = np.concatenate([context, res.token_ids, _ids(args.turn_delta, 300 + turn, vocab)])
            bucket.append(time.perf_counter() - t0)
    batched, round_robin = await _concurrent(args, backend, req, vocab)
    await backend.close()
    med = statistics.median
    return {
        "machine": {**machine(), "torch_threads": args.threads, "load_avg_1m_at_end": os.getloadavg()[0]},
        "model": str(args.model), "repeats": args.repeats, "device": args.device, "dtype": args.dtype,
        "prefill_tokens_per_s": med(prefill), "prefill_tokens": args.prefill_tokens,
        "decode_tokens_per_s_routing_on": med(decode_on), "decode_tokens_per_s_routing_off": med(decode_off),
        # Paired: each repeat runs on and off back to back, so load drift cancels within a pair.
        "routing_capture_cost": 1 - med([on / off for on, off in zip(decode_on, decode_off, strict=True)]),
        # Decode only (prefill time subtracted); paired per repeat like the routing cost.
        "concurrent_sessions": args.sessions,
        "concurrent_tokens_per_s_batched": med(batched), "concurrent_tokens_per_s_round_robin": med(round_robin),
        "batched_speedup": med([b / o for b, o in zip(batched, round_robin, strict=True)]),
        "session_seconds_reuse": med(reuse_s), "session_seconds_no_reuse": med(full_s),
        "prefix_reuse_speedup": med(full_s) / med(reuse_s),
        "session": {"turns": args.turns, "start_tokens": args.session_start, "turn_tokens": args.turn_tokens,
                    "delta_tokens": args.turn_delta},
    }


def print_table(r: dict) -> None:
    rows = [
        ("prefill tokens/s", f"{r['prefill_tokens_per_s']:.0f}", f"prompt {r['prefill_tokens']}"),
        ("decode tokens/s, routing on", f"{r['decode_tokens_per_s_routing_on']:.1f}", ""),
        ("decode tokens/s, routing off", f"{r['decode_tokens_per_s_routing_off']:.1f}", ""),
        ("routing capture cost", f"{100 * r['routing_capture_cost']:.1f}%", "target < 5%"),
        (f"{r['concurrent_sessions']} sessions tokens/s, batched", f"{r['concurrent_tokens_per_s_batched']:.1f}",
         "one forward for all"),
        (f"{r['concurrent_sessions']} sessions tokens/s, round-robin",
         f"{r['concurrent_tokens_per_s_round_robin']:.1f}", "max_batch 1"),
        ("batched decode speedup", f"{r['batched_speedup']:.2f}x", "paired median"),
        ("session s, prefix reuse", f"{r['session_seconds_reuse']:.2f}", f"{r['session']['turns']} turns"),
        ("session s, full prefill", f"{r['session_seconds_no_reuse']:.2f}", ""),
        ("prefix reuse speedup", f"{r['prefix_reuse_speedup']:.2f}x", ""),
    ]
    print(f"{'metric (median of ' + str(r['repeats']) + ')':34} {'value':>10}  note")
    for name, value, note in rows:
        print(f"{name:34} {value:>10}  {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="Model folder; default: a fresh random-init --preset model.")
    parser.add_argument("--preset", choices=["tiny", "small"], default="tiny")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefill-tokens", type=int, default=1024)
    parser.add_argument("--decode-prompt", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--sessions", type=int, default=8, help="Concurrent sessions of the batched row.")
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--session-start", type=int, default=1024)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--turn-delta", type=int, default=256)
    parser.add_argument("--device", default="cpu", help="torch device of the backend (cuda on a GPU).")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, help="Write the results as JSON here.")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            from t1.model.init import init_model

            args.model = init_model(Path(tmp) / args.preset, args.preset, seed=0)
        results = asyncio.run(run(args))
    results["preset"] = args.preset if results["model"].startswith(tempfile.gettempdir()) else None
    print_table(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
