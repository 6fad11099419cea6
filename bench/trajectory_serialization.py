"""Trajectory codec throughput: encode, decode and stream a long-episode record (msgpack, numpy views).

    python bench/trajectory_serialization.py --out bench/results/codec.json [--tokens 32768 --layers 48 --top-k 8 --reps 15]

The record is one segment of `tokens` positions with routing [tokens, layers, top_k] uint8 (a
Qwen3-30B-A3B-like MoE: 48 layers, top-8 of 128 experts). Prints medians and writes JSON.
"""  # noqa: E501

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is not on the path

from bench.machine_info import machine
from t1.trajectory.serialization import decode_trajectory, encode_trajectory, iter_trajectories
from t1.trajectory.types import EpisodeStatus, Segment, Trajectory, TurnSpan


def make_trajectory(tokens: int, layers: int, top_k: int, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    mask = rng.random(tokens) < 0.4
    seg = Segment(
        token_ids=rng.integers(0, 150_000, tokens).astype(np.int32),
        logprobs=np.where(mask, -rng.random(tokens), np.nan).astype(np.float32), loss_mask=mask,
        policy_versions=np.where(mask, 7, -1).astype(np.int32),
        routing=rng.integers(0, 128, (tokens, layers, top_k)).astype(np.uint8),
        turns=tuple(TurnSpan(i, i + 50, 0.0) for i in range(0, tokens - 50, 200)))
    return Trajectory(id="bench", task_id="task", group_id="g", attempt=0, segments=(seg,), reward=1.0,
                      status=EpisodeStatus.OK)


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="write the JSON result here")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)

    traj = make_trajectory(args.tokens, args.layers, args.top_k)
    data = encode_trajectory(traj)
    mb = len(data) / 1e6
    stream = b"".join([data] * 4)
    enc = timed(lambda: encode_trajectory(traj), args.reps)
    dec = timed(lambda: decode_trajectory(data), args.reps)
    rt = timed(lambda: decode_trajectory(encode_trajectory(traj)), args.reps)
    st = timed(lambda: list(iter_trajectories(io.BytesIO(stream))), args.reps)
    result = {
        "machine": machine(),
        "settings": vars(args) | {"out": str(args.out)}, "record_mb": mb,
        "encode_mb_s": mb / enc, "decode_mb_s": mb / dec, "roundtrip_mb_s": mb / rt,
        "stream_decode_mb_s": 4 * mb / st,
        "median_s": {"encode": enc, "decode": dec, "roundtrip": rt, "stream_4_records": st},
    }
    print(f"record {mb:.1f} MB ({args.tokens} tokens, routing {args.layers}x{args.top_k} uint8), median of {args.reps}")
    print(f"{'op':<12}{'median s':>12}{'MB/s':>12}")
    for op, s, rate in (("encode", enc, mb / enc), ("decode", dec, mb / dec), ("roundtrip", rt, mb / rt),
                        ("stream x4", st, 4 * mb / st)):
        print(f"{op:<12}{s:>12.5f}{rate:>12.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
