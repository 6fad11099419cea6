"""Batched decode of sessions with unequal cache lengths: KV slots against the old equal-length grouping.

N concurrent sessions, prompts spread evenly over --min-prompt..--max-prompt tokens, --new-tokens
each, on the torch backend in process (the same code path as t1-inference). Two backends on the
same model, side by side in one run, alternating per repeat:
- `slots`: every session's cache is a KV slot; decode steps of any lengths share a forward;
- `grouped`: a DynamicCache per session, decode steps batched only at equal cache length (T1
  before KV slots; with spread-out prompts nearly every forward is one session).

Decode tokens/s subtracts the time of the same gather with one new token (prefills and first
tokens), as bench/inference.py does; end-to-end tokens/s does not. Rows per --threads value.
With --episode-turns T > 0 each size also runs agent-like episodes: T turns per session (a session
id, so each turn prefills only its new ids), --tool-ms (uniform 0..2x) of pause between turns, so
the decoding set changes every few steps; tokens/s there is end to end.

    python bench/decode_batching.py [--model DIR | --preset learn] [--sessions 16,32] [--threads 1,2]
                                    [--repeats 3] [--new-tokens 48] [--episode-turns 4 --tool-ms 50]
                                    [--out FILE]
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

from bench.machine_info import describe, machine

MODES = ("slots", "grouped")


def _prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.linspace(lo, hi, n).round().astype(int)
    return [rng.integers(16, vocab, size=int(k)).astype(np.int32) for k in lengths]


async def _gather(backend, prompts: list[np.ndarray], new_tokens: int) -> tuple[float, int]:
    from t1.inference.types import GenerateRequest, SamplingParams

    t0 = time.perf_counter()
    results = await asyncio.gather(*(
        backend(GenerateRequest("", p, SamplingParams(temperature=1.0, seed=i, max_tokens=new_tokens)))
        for i, p in enumerate(prompts)))
    return time.perf_counter() - t0, sum(len(r.token_ids) for r in results)


async def _episodes(backend, prompts: list[np.ndarray], args, seed: int) -> tuple[float, int]:
    """Every session runs args.episode_turns turns with tool pauses between them; returns (seconds, tokens)."""
    from t1.inference.types import GenerateRequest, SamplingParams

    rng = np.random.default_rng(seed)
    pauses = rng.uniform(0, 2 * args.tool_ms / 1000, size=(len(prompts), args.episode_turns))
    deltas = [[rng.integers(16, backend.vocab_size, size=24).astype(np.int32) for _ in range(args.episode_turns)]
              for _ in prompts]

    async def episode(i: int, context: np.ndarray) -> int:
        made = 0
        for turn in range(args.episode_turns):
            res = await backend(GenerateRequest(f"ep-{seed}-{i}", context, SamplingParams(
                temperature=1.0, seed=turn, max_tokens=args.new_tokens)))
            made += len(res.token_ids)
            context = np.concatenate([context, res.token_ids, deltas[i][turn]])
            await asyncio.sleep(pauses[i, turn])
        return made

    t0 = time.perf_counter()
    made = await asyncio.gather(*(episode(i, p) for i, p in enumerate(prompts)))
    return time.perf_counter() - t0, sum(made)


async def _measure(args, backends: dict, sessions: int) -> dict:
    decode: dict[str, list[float]] = {m: [] for m in MODES}
    end_to_end: dict[str, list[float]] = {m: [] for m in MODES}
    mean_batch: dict[str, list[float]] = {m: [] for m in MODES}
    vocab = backends["slots"].vocab_size
    for r in range(args.repeats):
        prompts = _prompts(sessions, args.min_prompt, args.max_prompt, vocab, seed=1000 * sessions + r)
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):  # alternate: drift on a shared machine favours neither
            backend = backends[mode]
            first_s, _ = await _gather(backend, prompts, 1)
            backend.batcher.batch_sizes.clear()
            seconds, tokens = await _gather(backend, prompts, args.new_tokens)
            decode[mode].append((tokens - sessions) / max(seconds - first_s, 1e-9))
            end_to_end[mode].append(tokens / seconds)
            mean_batch[mode].append(statistics.fmean(backend.batcher.batch_sizes))
    episodes: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.repeats if args.episode_turns else 0):
        prompts = _prompts(sessions, args.min_prompt, args.max_prompt, vocab, seed=2000 * sessions + r)
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            seconds, tokens = await _episodes(backends[mode], prompts, args, seed=r)
            episodes[mode].append(tokens / seconds)
    med = statistics.median
    row: dict = {"sessions": sessions}
    for mode in MODES:
        row[mode] = {"decode_tokens_per_s": med(decode[mode]), "end_to_end_tokens_per_s": med(end_to_end[mode]),
                     "mean_rows_per_decode_forward": med(mean_batch[mode]),
                     "decode_tokens_per_s_runs": decode[mode]}
    row["decode_speedup"] = med([s / g for s, g in zip(decode["slots"], decode["grouped"], strict=True)])
    row["end_to_end_speedup"] = med([s / g for s, g in zip(end_to_end["slots"], end_to_end["grouped"],
                                                            strict=True)])
    if args.episode_turns:
        for mode in MODES:
            row[mode]["episodes_tokens_per_s"] = med(episodes[mode])
        row["episodes_speedup"] = med([s / g for s, g in zip(episodes["slots"], episodes["grouped"], strict=True)])
    return row


async def run(args: argparse.Namespace) -> dict:
    import torch

    from t1.inference.server.torch_backend import TorchBackend

    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for sessions in args.sessions:
            backends = {mode: TorchBackend(args.model, max_batch=sessions, kv_slots=mode == "slots",
                                           device=args.device, dtype=args.dtype) for mode in MODES}
            for backend in backends.values():
                backend.eos_ids = ()  # every request generates exactly --new-tokens
                await _gather(backend, _prompts(2, 16, 32, backend.vocab_size, 0), 4)  # warm up
            rows.append({"threads": threads, **await _measure(args, backends, sessions)})
            for backend in backends.values():
                await backend.close()
    return {
        "machine": {**machine(args.device), "load_avg_1m_at_end": os.getloadavg()[0]},
        "model": str(args.model), "preset": args.preset if args.model_made else None,
        "settings": {"repeats": args.repeats, "new_tokens": args.new_tokens, "min_prompt": args.min_prompt,
                     "max_prompt": args.max_prompt, "device": args.device, "dtype": args.dtype,
                     "temperature": 1.0, "episode_turns": args.episode_turns, "tool_ms": args.tool_ms},
        "rows": rows,
    }


def print_table(r: dict) -> None:
    s = r["settings"]
    print(f"decode batching, {s['min_prompt']}-{s['max_prompt']}-token prompts, {s['new_tokens']} new tokens each, "
          f"median of {s['repeats']}; {describe(r['machine'])}")
    head = (f"{'threads':>7} {'sessions':>8} {'slots tok/s':>12} {'grouped tok/s':>14} {'speedup':>8} "
            f"{'e2e slots':>10} {'e2e grouped':>12} {'e2e x':>6} {'rows/fwd':>9}")
    print(head)
    for row in r["rows"]:
        sl, gr = row["slots"], row["grouped"]
        print(f"{row['threads']:>7} {row['sessions']:>8} {sl['decode_tokens_per_s']:>12.0f} "
              f"{gr['decode_tokens_per_s']:>14.0f} {row['decode_speedup']:>7.2f}x "
              f"{sl['end_to_end_tokens_per_s']:>10.0f} {gr['end_to_end_tokens_per_s']:>12.0f} "
              f"{row['end_to_end_speedup']:>5.2f}x {sl['mean_rows_per_decode_forward']:>4.1f}/"
              f"{gr['mean_rows_per_decode_forward']:.1f}")
    if s["episode_turns"]:
        print(f"episodes: {s['episode_turns']} turns per session, tool pauses 0-{2 * s['tool_ms']:.0f} ms, "
              "end-to-end tokens/s")
        print(f"{'threads':>7} {'sessions':>8} {'slots tok/s':>12} {'grouped tok/s':>14} {'speedup':>8}")
        for row in r["rows"]:
            print(f"{row['threads']:>7} {row['sessions']:>8} {row['slots']['episodes_tokens_per_s']:>12.0f} "
                  f"{row['grouped']['episodes_tokens_per_s']:>14.0f} {row['episodes_speedup']:>7.2f}x")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="Model folder; default: a fresh random-init --preset model.")
    parser.add_argument("--preset", choices=["tiny", "small", "learn"], default="learn")
    parser.add_argument("--sessions", type=_ints, default=[16, 32], help="Concurrent sessions, comma separated.")
    parser.add_argument("--threads", type=_ints, default=[1], help="torch intra-op threads, comma separated.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--min-prompt", type=int, default=200)
    parser.add_argument("--max-prompt", type=int, default=900)
    parser.add_argument("--episode-turns", type=int, default=0, help="Turns of the episodes rows (0: none).")
    parser.add_argument("--tool-ms", type=float, default=50.0, help="Mean tool pause between turns (ms).")
    parser.add_argument("--device", default="cpu", help="torch device of the backend (cuda on a GPU).")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, help="Write the results as JSON here.")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.new_tokens < 2 or not 1 <= args.min_prompt <= args.max_prompt \
            or args.episode_turns < 0 or args.tool_ms < 0:
        parser.error("need --repeats >= 1, --new-tokens >= 2, 1 <= --min-prompt <= --max-prompt, "
                     "--episode-turns >= 0 and --tool-ms >= 0")
    return args


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.model_made = args.model is None
        if args.model is None:
            from t1.model.init import init_model

            args.model = init_model(Path(tmp) / args.preset, args.preset, seed=0)
        results = asyncio.run(run(args))
    print_table(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
