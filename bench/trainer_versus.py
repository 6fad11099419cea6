"""PPO and SFT steps of this tree against another source tree of T1 (today's main), side by side:
one worker process per tree, steps interleaved, medians over `reps`.

    git archive d0f31c7 t1 | tar -x -C /tmp/t1-base
    python bench/trainer_versus.py --baseline-src /tmp/t1-base --out bench/results/trainer_versus_cpu_tiny.json

Both workers train copies of the same random-init model (preset) on the same sequences (as
bench/trainer.py builds them: routing recorded from the model's own router, replay on) through
their tree's TrainerCore on DeepSpeed (gloo on CPU); each worker keeps its own weights, so the
two see the same shapes and token counts, step after step. On CPU the clock is process CPU time
(steadier on a shared machine than wall time, which is reported too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KINDS = ("ppo", "sft")


def _worker(src: Path, model_dir: Path, args: argparse.Namespace) -> int:
    """Serve steps on stdin ('ppo' | 'sft' | 'quit'), one JSON timing line per step on stdout."""
    sys.path.insert(0, str(src))
    sys.path.insert(1, str(REPO))  # bench/ itself comes from this tree
    import torch

    torch.set_num_threads(args.threads)
    import t1
    from bench.trainer import _sequences
    from t1.config.loader import validate
    from t1.trainer.core import TrainerCore
    from t1.trainer.engine import shutdown_distributed

    if not Path(t1.__file__).resolve().is_relative_to(src.resolve()):
        raise RuntimeError(f"worker for {src} imported t1 from {t1.__file__}")
    work = Path(tempfile.mkdtemp(prefix="t1-bench-versus-"))
    cfg = validate({
        "metrics": {"port": None},
        "trainer": {"work_dir": str(work), "policy_path": str(model_dir),
                    "rl": {"token_budget": args.token_budget, "routing_replay": True},
                    "deepspeed": {"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0,
                                  "bf16": {"enabled": torch.cuda.is_available()},
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-6, "torch_adam": True}}}},
    })
    core = TrainerCore(cfg)
    seqs = _sequences(model_dir, args.seqs, args.tokens, seed=0)
    learner = core.learner
    print("ready", flush=True)
    for line in sys.stdin:
        kind = line.strip()
        if kind == "quit":
            break
        if kind not in KINDS:
            raise ValueError(f"unknown step kind {kind!r}; expected one of {KINDS}")
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        if kind == "ppo":
            learner.ppo_step(seqs, learner.prepare(seqs), update_policy=True)
        else:
            learner.sft_step(seqs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}), flush=True)
    core.close()
    shutdown_distributed()
    return 0


class _Worker:
    def __init__(self, name: str, src: Path, model_dir: Path, args: argparse.Namespace) -> None:
        cmd = [sys.executable, __file__, "--worker-src", str(src), "--model", str(model_dir),
               "--seqs", str(args.seqs), "--tokens", str(args.tokens), "--token-budget", str(args.token_budget),
               "--threads", str(args.threads), "--out", "-"]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(src)}
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._expect("ready")

    def _expect(self, word: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(word) or (word == "{" and line.startswith("{")):
                return line
        raise RuntimeError(f"{self.name} worker exited ({self.proc.wait()}) before sending {word!r}")

    def step(self, kind: str) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        return dict(json.loads(self._expect("{")))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=str, required=True, help="write the JSON result here")
    p.add_argument("--baseline-src", type=Path, help="a source tree holding the t1 package to compare against")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--token-budget", type=int, default=1024)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker-src", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_src is not None:
        return _worker(args.worker_src, args.model, args)
    if args.baseline_src is None:
        p.error("--baseline-src is required")
    sys.path.insert(0, str(REPO))
    from bench.machine_info import cpu_name
    from t1.model.init import init_model

    model_dir = init_model(Path(tempfile.mkdtemp(prefix="t1-bench-versus-model-")) / "model", args.preset, seed=0)
    workers = {"this": _Worker("this", REPO, model_dir, args), "baseline": _Worker("baseline", args.baseline_src,
                                                                                   model_dir, args)}
    times: dict[str, dict[str, list[dict[str, float]]]] = {w: {k: [] for k in KINDS} for w in workers}
    for rep in range(args.reps + 1):  # the first round warms up
        for kind in KINDS:
            for name, w in (workers.items() if rep % 2 else reversed(list(workers.items()))):
                t = w.step(kind)
                if rep:
                    times[name][kind].append(t)
    for w in workers.values():
        w.close()
    clock = "cpu_s"
    med = {n: {k: statistics.median(t[clock] for t in times[n][k]) for k in KINDS} for n in workers}
    wall = {n: {k: statistics.median(t["wall_s"] for t in times[n][k]) for k in KINDS} for n in workers}
    total = args.seqs * args.tokens
    print(f"{args.seqs} x {args.tokens} tokens, preset {args.preset}, ZeRO-2, budget {args.token_budget}, "
          f"median of {args.reps} interleaved (process CPU s)")
    print(f"{'step':<6}{'this s':>10}{'baseline s':>12}{'this/base':>11}{'this wall':>11}{'base wall':>11}")
    for k in KINDS:
        print(f"{k:<6}{med['this'][k]:>10.3f}{med['baseline'][k]:>12.3f}{med['this'][k] / med['baseline'][k]:>11.3f}"
              f"{wall['this'][k]:>11.3f}{wall['baseline'][k]:>11.3f}")
    result: dict[str, Any] = {
        "machine": f"{os.uname().nodename}: {cpu_name()}, {os.cpu_count()} cores",
        "settings": {k: str(v) for k, v in vars(args).items() if k not in ("worker_src", "model")},
        "tokens_per_step": total, "clock": "process_cpu",
        "median_s": med, "median_wall_s": wall,
        "ratio_this_over_baseline": {k: med["this"][k] / med["baseline"][k] for k in KINDS},
        "all": times,
    }
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
