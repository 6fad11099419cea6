"""Long-context trainer memory: peak memory and tokens/s of one policy forward + backward through
the logprob path, full logits (naive) vs chunked, for sequence lengths x vocabularies.

    python bench/trainer_long_context.py --out bench/results/trainer_long_context_cpu.json \
        [--preset tiny --vocabs 1024 151936 --lengths 2048 4096 8192 16384 32768]

Each point runs in its own process (a random-init model of the preset's shapes with that
vocabulary, one packed row of T tokens, every target an action, activation checkpointing per
decoder layer), so one path's memory never counts against the other's. The process gets an
address-space limit (--naive-cap-gib, --chunked-cap-gib) so the naive path cannot exhaust a shared
machine: a point that hits it is reported as not fitting, and longer naive points are skipped.
Peak memory is the process's peak RSS minus its RSS before the step on CPU, and the peak
allocated bytes of the step on a GPU. Naive and chunked run side by side at each length.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GIB = 1 << 30


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(preset: str, vocab: int, tokens: int, chunk_tokens: int, checkpointing: bool) -> dict[str, Any]:
    """One forward + backward of a PPO-shaped loss over logp and entropy at `tokens` action tokens."""
    import numpy as np
    import torch
    from transformers import Qwen3MoeForCausalLM

    from t1.model.init import model_config
    from t1.model.presets import get_preset
    from t1.trainer.attention import use_packed_attention
    from t1.trainer.batch import TrainSequence
    from t1.trainer.packing import pack
    from t1.trainer.token_stats import policy_token_stats

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    model: Any = Qwen3MoeForCausalLM(model_config(get_preset(preset), vocab))
    model = model.to(dev)
    model.config.use_cache = False
    use_packed_attention(model)  # as the trainer's models run
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    n = tokens + 1
    ids = np.random.default_rng(0).integers(0, vocab, size=n).astype(np.int32)
    mask = np.ones(n, bool)
    mask[0] = False
    batch = pack([TrainSequence("t", "g", 0, ids, np.zeros(n, np.float32), mask, np.zeros(n, np.int32), None,
                                np.zeros(n, np.float32))])
    adv_N = torch.randn(batch.num_actions, device=dev)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    t0, c0 = time.perf_counter(), time.process_time()
    stats = policy_token_stats(model, batch, dev, temperature=0.7, chunk_tokens=chunk_tokens)
    loss = -(stats.logp_N * adv_N).mean() - 0.01 * stats.entropy_N.mean()
    loss.backward()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"fits": True, "peak_bytes": int(peak), "wall_s": wall, "cpu_s": cpu, "tokens_per_s": tokens / wall,
            "memory": "gpu_allocated" if cuda else "rss_over_start"}


def _worker(args: argparse.Namespace) -> int:
    if args.cap_gib > 0:  # 0: no cap (a GPU process needs far more address space than it uses)
        cap = int(args.cap_gib * GIB)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import torch

    torch.set_num_threads(args.threads)
    try:
        out = measure(args.preset, args.vocab, args.tokens, args.chunk_tokens, not args.no_checkpointing)
    except (MemoryError, RuntimeError) as e:  # the address-space cap: this point does not fit
        if "memory" not in str(e).lower() and not isinstance(e, MemoryError):
            raise
        out = {"fits": False, "error": str(e).splitlines()[0][:200]}
    print(json.dumps(out), flush=True)
    return 0


def _point(args: argparse.Namespace, vocab: int, tokens: int, chunk: int, cap_gib: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--preset", args.preset, "--vocab", str(vocab), "--tokens",
           str(tokens), "--chunk-tokens", str(chunk), "--cap-gib", str(cap_gib), "--threads", str(args.threads)]
    if args.no_checkpointing:
        cmd.append("--no-checkpointing")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.point_timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"fits": False, "error": f"timed out after {args.point_timeout_s:.0f} s", "timed_out": True}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"fits": False, "error": f"exit {proc.returncode}: {tail[0][:200]}"}
    return dict(json.loads(lines[-1]))


def _linear_fit(points: list[tuple[int, float]]) -> dict[str, float]:
    """Least squares peak = a + b * T, with the largest relative residual."""
    import numpy as np

    t = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    b, a = np.polyfit(t, y, 1)
    resid = float(np.max(np.abs(a + b * t - y) / y))
    return {"intercept_bytes": float(a), "bytes_per_token": float(b), "max_rel_residual": resid}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="write the JSON result here")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    p.add_argument("--vocabs", type=int, nargs="+", default=[1024, 151_936])
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    p.add_argument("--chunk-tokens", type=int, default=1024, help="the chunked path's logprob_chunk_tokens")
    p.add_argument("--naive-cap-gib", type=float, default=6.0, help="address-space cap per point; 0: none")
    p.add_argument("--chunked-cap-gib", type=float, default=8.0, help="address-space cap per point; 0: none")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-checkpointing", action="store_true", help="keep every layer's activations")
    p.add_argument("--point-timeout-s", type=float, default=900.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cap-gib", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.out is None:
        p.error("--out is required")
    from bench.machine_info import cpu_name

    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"lines": []}
    print(f"policy forward+backward, preset {args.preset} shapes, every target an action, "
          f"checkpointing {'off' if args.no_checkpointing else 'on'}, chunk {args.chunk_tokens}, {args.threads} "
          "thread(s)")
    print(f"{'V':>8}{'T':>8}{'naive GiB':>12}{'chunked GiB':>13}{'ratio':>8}{'naive tok/s':>13}{'chunked tok/s':>15}")
    for vocab in args.vocabs:
        naive_fits = True
        for tokens in args.lengths:
            naive = _point(args, vocab, tokens, 0, args.naive_cap_gib) if naive_fits else {"fits": False,
                                                                                              "skipped": True}
            naive_fits = bool(naive["fits"])
            chunked = _point(args, vocab, tokens, args.chunk_tokens, args.chunked_cap_gib)
            rows.append({"vocab": vocab, "tokens": tokens, "naive": naive, "chunked": chunked})
            print(_row(vocab, tokens, naive, chunked), flush=True)
            summary = _write(args, rows, cpu_name())  # after every row: a long run keeps what it measured
    for line in summary["lines"]:
        print(line)
    return 0


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], cpu: str) -> dict[str, Any]:
    summary = _summary(rows, args)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    result = {
        "machine": f"{platform.node()}: {cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB",
        "settings": {k: str(v) for k, v in vars(args).items() if k not in ("worker", "vocab", "tokens", "cap_gib")},
        "rows": rows,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return summary


def _row(vocab: int, tokens: int, naive: dict[str, Any], chunked: dict[str, Any]) -> str:
    def gib(r: dict[str, Any]) -> str:
        if r["fits"]:
            return f"{r['peak_bytes'] / GIB:.2f}"
        return "skip" if r.get("skipped") else ("timeout" if r.get("timed_out") else "> cap")

    def tps(r: dict[str, Any]) -> str:
        return f"{r['tokens_per_s']:.0f}" if r["fits"] else "-"

    ratio = f"{chunked['peak_bytes'] / naive['peak_bytes']:.3f}" if naive["fits"] and chunked["fits"] else "-"
    return f"{vocab:>8}{tokens:>8}{gib(naive):>12}{gib(chunked):>13}{ratio:>8}{tps(naive):>13}{tps(chunked):>15}"


def _summary(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per vocabulary: linear fits of both paths' peaks, and naive projected where it did not fit."""
    out: dict[str, Any] = {"lines": []}
    for vocab in args.vocabs:
        mine = [r for r in rows if r["vocab"] == vocab]
        chunk_pts = [(r["tokens"], r["chunked"]["peak_bytes"]) for r in mine if r["chunked"]["fits"]]
        naive_pts = [(r["tokens"], r["naive"]["peak_bytes"]) for r in mine if r["naive"]["fits"]]
        entry: dict[str, Any] = {}
        if len(chunk_pts) >= 2:
            entry["chunked_fit"] = _linear_fit(chunk_pts)
        if len(naive_pts) >= 2:
            entry["naive_fit"] = _linear_fit(naive_pts)
        longest = max((r["tokens"] for r in mine if r["chunked"]["fits"]), default=max(args.lengths))
        last = next((r for r in mine if r["tokens"] == longest), None)
        if last is not None and last["chunked"]["fits"]:
            c = last["chunked"]["peak_bytes"]
            if last["naive"]["fits"]:
                entry["ratio_at_longest"] = c / last["naive"]["peak_bytes"]
                how = "measured"
            elif "naive_fit" in entry:
                f = entry["naive_fit"]
                entry["naive_projected_at_longest_bytes"] = f["intercept_bytes"] + f["bytes_per_token"] * longest
                entry["ratio_at_longest"] = c / entry["naive_projected_at_longest_bytes"]
                how = f"naive projected from {len(naive_pts)} measured points"
            else:
                how = ""
            if "ratio_at_longest" in entry:
                out["lines"].append(f"V={vocab} T={longest}: chunked/naive peak {entry['ratio_at_longest']:.4f} "
                                    f"({how})")
        if "chunked_fit" in entry:
            f = entry["chunked_fit"]
            out["lines"].append(f"V={vocab} chunked peak ~ {f['intercept_bytes'] / GIB:.2f} GiB + "
                                f"{f['bytes_per_token'] / 1024:.1f} KiB/token (max residual "
                                f"{100 * f['max_rel_residual']:.1f}%)")
        if "naive_fit" in entry:
            f = entry["naive_fit"]
            out["lines"].append(f"V={vocab} naive peak ~ {f['intercept_bytes'] / GIB:.2f} GiB + "
                                f"{f['bytes_per_token'] / 1024:.1f} KiB/token")
        out[str(vocab)] = entry
    return out


if __name__ == "__main__":
    raise SystemExit(main())
