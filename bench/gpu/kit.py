"""The GPU kit's parts, each a benchmark in its own process under its own time limit, then one summary.

    python -m bench.gpu.kit --out DIR [--cpu] [--only model,inference,...]

Parts (bench/gpu/README.md): model (a random-init Qwen3-MoE of production-like depth, made once),
inference (bench/inference.py: torch backend, bf16, prefill/decode tokens/s, routing capture on vs
off, batched sessions), fidelity_shape (bench.fidelity at the model's shape), fidelity_default
(bench.fidelity's own default model), trainer (bench/trainer.py: a DeepSpeed PPO step, replay on vs
off, peak memory) and long_context (bench/trainer_long_context.py: chunked vs full logits).
`--cpu` is the dry run: tiny shapes, CPU, short limits; the tests run it so the kit cannot rot.
Every part writes DIR/<part>.json and DIR/logs/<part>.log; a part that fails or runs out of time is
recorded as such and the next one runs. DIR/summary.json and the table printed last say it all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Shape:
    """The model the parts share, and the sizes of each part's workload."""

    layers: int  # the model (bench/gpu/model.py) ...
    experts: int
    top_k: int
    hidden: int  # ... and moe_intermediate_size; head_dim = hidden / the tiny preset's 4 heads
    device: str  # where inference and fidelity run (the trainer parts pick the GPU when there is one)
    dtype: str
    inference: tuple[str, ...]
    fidelity: tuple[str, ...]
    trainer: tuple[str, ...]
    long_context: tuple[str, ...]
    limits_s: dict[str, float]


# Sized from the first H200 run (bench/results/gpu_h200.json): the torch backend decodes this model at 9-21
# tokens/s there (eager transformers MoE, one sync per layer for routing capture), so the decode-heavy parts
# keep few sampled tokens; the limits add up to 570 s, inside one device call of 600 s.
GPU = Shape(
    layers=24, experts=64, top_k=8, hidden=512, device="cuda", dtype="bfloat16",
    inference=("--repeats", "1", "--prefill-tokens", "4096", "--decode-prompt", "64", "--decode-tokens", "32",
               "--sessions", "8", "--turns", "2", "--session-start", "2048", "--turn-tokens", "16",
               "--turn-delta", "256"),
    fidelity=("--episodes", "1", "--turns", "2", "--max-tokens", "32", "--time-reps", "1"),
    trainer=("--seqs", "8", "--tokens", "1024", "--token-budget", "4096", "--reps", "3", "--zero", "2"),
    long_context=("--vocabs", "151936", "--lengths", "8192", "32768", "65536",
                  "--naive-cap-gib", "0", "--chunked-cap-gib", "0", "--point-timeout-s", "50"),
    limits_s={"model": 60, "inference": 120, "fidelity_shape": 120, "fidelity_default": 60, "trainer": 90,
              "long_context": 120},
)
CPU = Shape(
    layers=2, experts=4, top_k=2, hidden=32, device="cpu", dtype="float32",
    inference=("--repeats", "1", "--prefill-tokens", "32", "--decode-prompt", "8", "--decode-tokens", "4",
               "--sessions", "2", "--turns", "2", "--session-start", "16", "--turn-tokens", "2", "--turn-delta", "8"),
    fidelity=("--episodes", "1", "--turns", "1", "--max-tokens", "4", "--time-reps", "1"),
    trainer=("--seqs", "2", "--tokens", "32", "--token-budget", "64", "--reps", "1", "--zero", "2"),
    long_context=("--vocabs", "1024", "--lengths", "64", "--chunk-tokens", "32", "--naive-cap-gib", "0",
                  "--chunked-cap-gib", "0", "--point-timeout-s", "60"),
    # generous: the dry run proves the kit works, and a shared CPU runs each process at a fraction of a core
    limits_s={"model": 150, "inference": 150, "fidelity_shape": 150, "fidelity_default": 150, "trainer": 200,
              "long_context": 150},
)
PARTS = ("model", "inference", "fidelity_shape", "fidelity_default", "trainer", "long_context")


def commands(shape: Shape, out: Path) -> dict[str, list[str]]:
    """Each part's command line; the model folder is out/model."""
    py, model = sys.executable, str(out / "model")
    size = ("--layers", str(shape.layers), "--experts", str(shape.experts), "--top-k", str(shape.top_k),
            "--hidden", str(shape.hidden))
    fid = (py, "-m", "bench.fidelity", "--device", shape.device, "--dtype", shape.dtype, *shape.fidelity)
    return {
        "model": [py, "bench/gpu/model.py", "--out", model, *size],
        "inference": [py, "bench/inference.py", "--model", model, "--device", shape.device, "--dtype", shape.dtype,
                      *shape.inference, "--out", str(out / "inference.json")],
        "fidelity_shape": [*fid, *size, "--out", str(out / "fidelity_shape.json")],
        "fidelity_default": [*fid, "--out", str(out / "fidelity_default.json")],
        "trainer": [py, "bench/trainer.py", "--model", model, *shape.trainer, "--out", str(out / "trainer.json")],
        "long_context": [py, "bench/trainer_long_context.py", *shape.long_context,
                         "--out", str(out / "long_context.json")],
    }


def run_part(name: str, cmd: list[str], limit_s: float, out: Path) -> dict[str, Any]:
    """Run one part to completion or its limit; its output goes to out/logs/<name>.log."""
    log = out / "logs" / f"{name}.log"
    t0 = time.monotonic()
    with log.open("w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit_s)
            status = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the part and anything it started
            proc.wait()
            status = f"timed out ({limit_s:.0f} s)"
    return {"status": status, "seconds": round(time.monotonic() - t0, 1), "limit_s": limit_s, "log": str(log)}


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _model_line(out: Path) -> str:
    lines = [ln for ln in (out / "logs" / "model.log").read_text().splitlines() if ln.startswith("{")]
    m = json.loads(lines[-1])
    return (f"{m['layers']} layers, {m['experts']} experts top-{m['top_k']}, hidden {m['hidden']}: "
            f"{m['parameters'] / 1e6:,.1f} M parameters, {m['active_parameters'] / 1e6:,.1f} M active")


def _inference(r: dict[str, Any]) -> str:
    return (f"prefill {r['prefill_tokens_per_s']:.0f} tok/s; decode {r['decode_tokens_per_s_routing_on']:.1f} "
            f"(capture on) / {r['decode_tokens_per_s_routing_off']:.1f} (off) tok/s; "
            f"{r['concurrent_sessions']} sessions batched {r['concurrent_tokens_per_s_batched']:.0f} tok/s "
            f"({r['batched_speedup']:.1f}x round-robin)")


def _fidelity(r: dict[str, Any]) -> str:
    return (f"mean |dlogp| {r['mean_abs_dlogp_no_r3']:.4f} -> {r['mean_abs_dlogp_r3']:.4f} with R3; "
            f"flip rate {r['router_row_flip_rate']:.4f}; drift {r['drift_tokens']} tokens")


def _trainer(r: dict[str, Any]) -> str:
    t = r["tokens_per_s"]
    return (f"PPO step {t['replay_on']:.0f} tok/s replay on, {t['replay_off']:.0f} off "
            f"({100 * r['replay_overhead']:+.1f}%); peak {r['peak_memory_bytes'] / GIB:.1f} GiB")


def _long_context(r: dict[str, Any]) -> str:
    return "; ".join(r["summary"]["lines"]) or f"{len(r['rows'])} rows"


HEADLINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "inference": _inference, "fidelity_shape": _fidelity, "fidelity_default": _fidelity, "trainer": _trainer,
    "long_context": _long_context}


def headline(name: str, out: Path) -> str:
    """The part's figures in one line, from its JSON (or its log, for the model)."""
    try:
        if name == "model":
            return _model_line(out)
        r = _load(out / f"{name}.json")
        return "(no JSON)" if r is None else HEADLINES[name](r)
    except (OSError, KeyError, ValueError, IndexError, TypeError) as e:
        return f"(unreadable: {type(e).__name__} {e})"


def machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return f"{p.name}, {p.total_memory / GIB:.0f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}"
        return f"CPU, {os.cpu_count()} cores, torch {torch.__version__}"
    except Exception as e:  # the summary must still be written
        return f"unknown ({type(e).__name__})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cpu", action="store_true", help="dry run: tiny shapes on the CPU")
    p.add_argument("--only", default=",".join(PARTS), help="comma-separated parts (the model is made when needed)")
    args = p.parse_args(argv)
    shape = CPU if args.cpu else GPU
    wanted = [x for x in args.only.split(",") if x]
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        p.error(f"unknown parts {unknown}; the parts are {list(PARTS)}")
    if {"inference", "fidelity_shape", "trainer"} & set(wanted) and "model" not in wanted:
        wanted.insert(0, "model")
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    cmds = commands(shape, out)
    parts: dict[str, dict[str, Any]] = {}
    for name in [x for x in PARTS if x in wanted]:
        print(f"[kit] {name} (limit {shape.limits_s[name]:.0f} s) ...", flush=True)
        parts[name] = run_part(name, cmds[name], shape.limits_s[name], out)
        # a part cut off by its limit may have written what it measured so far (long_context writes per row)
        parts[name]["headline"] = headline(name, out) if parts[name]["status"] == "ok" or (
            out / f"{name}.json").exists() else ""
        print(f"[kit] {name}: {parts[name]['status']} in {parts[name]['seconds']} s", flush=True)
    summary = {"machine": machine(), "dry_run": args.cpu, "shape": {k: getattr(shape, k) for k in
                                                                    ("layers", "experts", "top_k", "hidden", "device",
                                                                     "dtype")}, "parts": parts}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nT1 GPU kit on {summary['machine']}{' (CPU dry run)' if args.cpu else ''}")
    print(f"{'part':<18}{'status':<22}{'s':>7}  figures")
    for name, r in parts.items():
        print(f"{name:<18}{r['status']:<22}{r['seconds']:>7.1f}  {r['headline']}")
    return 0 if all(r["status"] == "ok" for r in parts.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
