"""Trainer throughput: tokens/s of a full PPO step (pre-update pass, GAE, policy and critic update on
DeepSpeed) with routing replay on and off, and the replay overhead.

    python bench/trainer.py --out bench/results/trainer_cpu_tiny.json [--preset tiny --seqs 8 --tokens 256 --reps 7]

A random-init model of the preset (or --model DIR) is trained single-process (gloo on CPU, NCCL on a
GPU) on `seqs` sequences of `tokens` tokens whose second half is sampled; routing is what the
model's own router picked, recorded with a float32 forward, so both variants run the same experts.
Replay-on and replay-off steps alternate; medians over `reps` each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _sequences(model_dir: Path, seqs: int, tokens: int, seed: int) -> list:
    import torch
    from transformers import AutoModelForCausalLM

    from t1.routing.capture import capture_routing
    from t1.trainer.batch import TrainSequence

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(dev).eval()
    vocab = int(model.config.vocab_size)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(seqs):
        ids = rng.integers(16, vocab, size=tokens).astype(np.int32)
        with torch.no_grad(), capture_routing(model) as cap:
            logits = model(input_ids=torch.from_numpy(ids[None, :-1].astype(np.int64)).to(dev)).logits[0].cpu()
        routing = cap.concatenated()
        routing = np.concatenate(
            [routing, np.full((1, *routing.shape[1:]), np.iinfo(routing.dtype).max, routing.dtype)]
        )
        logp = torch.log_softmax(logits.float(), -1).gather(-1, torch.from_numpy(ids[1:, None].astype(np.int64)))
        mask = np.zeros(tokens, bool)
        mask[tokens // 2:] = True
        lp = np.full(tokens, np.nan, np.float32)
        lp[1:] = logp[:, 0].numpy()
        lp[~mask] = np.nan
        rewards = np.zeros(tokens, np.float32)
        rewards[-1] = float(i % 2)
        out.append(TrainSequence(f"t{i}", f"g{i // 2}", 0, ids, lp, mask, np.where(mask, 0, -1).astype(np.int32),
                                 routing, rewards))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="write the JSON result here")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    p.add_argument("--model", type=Path, help="use this model folder instead of a random-init preset")
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--token-budget", type=int, default=1024)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--zero", type=int, default=2, choices=[0, 1, 2, 3])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from t1.config.loader import validate
    from t1.model.init import init_model
    from t1.trainer.core import TrainerCore

    tmp = Path(tempfile.mkdtemp(prefix="t1-bench-trainer-"))
    model_dir = args.model or init_model(tmp / "model", args.preset, seed=0)
    cfg = validate({
        "metrics": {"port": None},
        "trainer": {"work_dir": str(tmp / "work"), "policy_path": str(model_dir),
                    "rl": {"token_budget": args.token_budget, "routing_replay": True},
                    "deepspeed": {"zero_optimization": {"stage": args.zero}, "gradient_clipping": 1.0,
                                  "bf16": {"enabled": torch.cuda.is_available()},
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-6, "torch_adam": True}}}},
    })
    core = TrainerCore(cfg)
    seqs = _sequences(model_dir, args.seqs, args.tokens, seed=0)
    learner = core.learner
    rl_on, rl_off = cfg.trainer.rl, cfg.trainer.rl.model_copy(update={"routing_replay": False})

    def step(rl) -> tuple[float, float]:
        """(wall s, process CPU s): on a shared CPU the CPU time is the steadier of the two."""
        learner.rl = rl
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        prep = learner.prepare(seqs)
        learner.ppo_step(seqs, prep, update_policy=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t0, time.process_time() - c0

    if torch.cuda.is_available():  # the routing-recording copy of the model is gone: count the steps only
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step(rl_on), step(rl_off)  # warm-up
    on, off = [], []
    for _ in range(args.reps):
        on.append(step(rl_on))
        off.append(step(rl_off))
    # peak of the steps with the engines and optimizer state resident (GPU allocated); on CPU the process's max RSS
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    total = args.seqs * args.tokens
    clock = 0 if torch.cuda.is_available() else 1  # GPU: wall time; CPU: process CPU time
    med_on, med_off = statistics.median(t[clock] for t in on), statistics.median(t[clock] for t in off)
    wall_on, wall_off = statistics.median(t[0] for t in on), statistics.median(t[0] for t in off)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{args.threads} thread(s)"
    result = {
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "device": device, "settings": {k: str(v) for k, v in vars(args).items()},
        "tokens_per_step": total,
        "clock": "wall" if clock == 0 else "process_cpu",
        "median_s": {"replay_on": med_on, "replay_off": med_off},
        "median_wall_s": {"replay_on": wall_on, "replay_off": wall_off},
        "tokens_per_s": {"replay_on": total / med_on, "replay_off": total / med_off},
        "replay_overhead": med_on / med_off - 1.0,
        "peak_memory_bytes": int(peak), "peak_memory": "gpu_allocated" if torch.cuda.is_available() else "max_rss",
        "all_s": {"replay_on": on, "replay_off": off},
    }
    print(f"PPO step on {device}: {args.seqs} x {args.tokens} tokens, preset {args.preset}, ZeRO-{args.zero}, "
          f"median of {args.reps}")
    print(f"{'routing':<12}{'median s':>12}{'tokens/s':>12}{'wall s':>12}   (s and tokens/s by {result['clock']} time)")
    for name, med, wall in (("replay on", med_on, wall_on), ("replay off", med_off, wall_off)):
        print(f"{name:<12}{med:>12.4f}{total / med:>12.0f}{wall:>12.4f}")
    print(f"replay overhead: {100 * (med_on / med_off - 1):+.2f}% (target < 3%); peak memory {peak / 2**30:.2f} GiB "
          f"({result['peak_memory']})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    core.close()
    from t1.trainer.engine import shutdown_distributed

    shutdown_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
