"""Fidelity of TITO + R3: sampler logprobs vs the trainer's full-forward logprobs, with and without replay.

    python bench/fidelity.py --out bench/results/fidelity_cpu.json [--preset tiny --episodes 4 --turns 4]

Runs multi-turn episodes with the torch inference backend (KV-cache decoding, routing capture) in
bfloat16 on a random-init MoE from `t1 model init`; observations are real bash output (subprocess).
Trajectories go through the TITO buffer. The trainer-style forward (one full forward per segment,
bfloat16, as in production) scores every loss token with and without routing replay, and a
forward+backward is timed both ways. --experts/--top-k/--layers/--hidden resize the MoE (same
tokenizer) for larger runs on a GPU. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from t1.inference.torch_backend import TorchBackend
from t1.inference.types import GenerateRequest, SamplingParams
from t1.routing.capture import capture_routing
from t1.routing.fidelity import segment_logprobs
from t1.tito import ChatRenderer, TokenBuffer
from t1.tito.diagnostics import rate, retokenize_mismatch, segment_drift
from t1.trajectory.types import EpisodeStatus, Trajectory

COMMANDS = ("ls -la /", "uname -a", "echo $((RANDOM % 1000)) files", "head -c 300 /etc/os-release",
            "ps -o pid,comm | head -5", "printf 'a\\tb\\n1\\t2\\n'", "date -u", "df -h / | tail -1")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bash(cmd: str, cap: int = 400) -> str:
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=10)
    return (out.stdout + out.stderr)[:cap]


def make_model(out: Path, args: argparse.Namespace) -> Path:
    """A random-init Qwen3-MoE folder from `t1 model init`, resized when asked (same tokenizer)."""
    from t1.model.init import init_model

    init_model(out, args.preset, seed=args.seed)
    if not any((args.experts, args.top_k, args.layers, args.hidden)):
        return out
    from transformers import AutoConfig, Qwen3MoeForCausalLM

    cfg = AutoConfig.from_pretrained(str(out))
    for key, val in (("num_experts", args.experts), ("num_experts_per_tok", args.top_k),
                     ("num_hidden_layers", args.layers), ("hidden_size", args.hidden)):
        if val:
            setattr(cfg, key, val)
    if args.hidden:
        cfg.moe_intermediate_size = cfg.intermediate_size = args.hidden
        cfg.head_dim = args.hidden // cfg.num_attention_heads
    torch.manual_seed(args.seed)
    model = Qwen3MoeForCausalLM(cfg).to(torch.float32)
    # As init_model does: routers and LM head with logits of std ~2 (a trained model's are peaked too).
    gen = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight") or name == "lm_head.weight":
                param.copy_(torch.randn(param.shape, generator=gen) * 2.0 / cfg.hidden_size**0.5)
    model.save_pretrained(str(out))
    return out


async def run_episode(backend: TorchBackend, renderer: ChatRenderer, args: argparse.Namespace,
                      episode: int) -> tuple[Trajectory, list[list[tuple[int, np.ndarray]]]]:
    buf = TokenBuffer(renderer, [
        {"role": "system", "content": "You are a terminal agent. Run one shell command per turn."},
        {"role": "user", "content": "Find out what system this is and how many files / holds."}])
    sampled: list[list[tuple[int, np.ndarray]]] = [[]]
    for turn in range(args.turns):
        prompt = buf.prompt_ids()
        params = SamplingParams(max_tokens=args.max_tokens, seed=1000 * episode + turn)
        res = await backend(GenerateRequest(f"ep{episode}", prompt, params))
        sampled[-1].append((len(prompt), np.asarray(res.token_ids).copy()))
        buf.append_generation(res)
        buf.append_observation([{"role": "tool", "content": bash(COMMANDS[(episode + turn) % len(COMMANDS)])}])
    traj = buf.export(id=f"ep{episode}", task_id="fidelity", group_id="g", attempt=episode, reward=0.0,
                      status=EpisodeStatus.OK)
    return traj, sampled


def time_steps(model: torch.nn.Module, seg: Any, reps: int) -> tuple[float, float]:
    """Median seconds of one forward+backward (sum of loss-token logprobs) on a segment, without and
    with replay; the two are interleaved so machine noise hits both alike."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * reps + 2):
        replay = bool(i % 2)
        model.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        logp, _ = segment_logprobs(model, seg, replay=replay, grad=True)
        logp.sum().backward()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i >= 2:  # first pair warms up
            times[replay].append(time.perf_counter() - t0)
    return statistics.median(times[False]), statistics.median(times[True])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--experts", type=int, default=0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--hidden", type=int, default=0)
    p.add_argument("--time-reps", type=int, default=15)
    p.add_argument("--model-dir", type=Path, help="reuse this folder instead of a fresh temp one")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = tempfile.TemporaryDirectory(prefix="t1-fidelity-")
    model_dir = make_model(args.model_dir or Path(tmp.name) / "model", args)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    renderer = ChatRenderer(tokenizer, end_of_turn=tokenizer.eos_token)

    async def episodes() -> list[tuple[Trajectory, list]]:
        backend = TorchBackend(model_dir, dtype=args.dtype, device=args.device)
        try:
            return [await run_episode(backend, renderer, args, e) for e in range(args.episodes)]
        finally:
            await backend.close()

    t0 = time.perf_counter()
    runs = asyncio.run(episodes())
    rollout_s = time.perf_counter() - t0
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, args.dtype)).to(args.device)
    model.eval()
    d_no, d_r3, flipped, drift, changed, total = [], [], [], 0, 0, 0
    replayed = compared = disagree = 0
    for traj, sampled in runs:
        for seg, smp in zip(traj.segments, sampled, strict=True):
            behaviour = torch.from_numpy(seg.logprobs[seg.loss_mask]).to(args.device)
            with capture_routing(model) as live:
                no, _ = segment_logprobs(model, seg, replay=False)
            r3, stats = segment_logprobs(model, seg, replay=True)
            assert stats is not None and seg.routing is not None
            d_no.append((no - behaviour).abs().cpu())
            d_r3.append((r3 - behaviour).abs().cpu())
            # Rows whose live routing differs from the record in any layer; a loss token at p is scored from row p-1.
            rows = (np.sort(live.concatenated(), -1) != np.sort(seg.routing[:-1], -1)).any(-1).any(-1)
            flipped.append(torch.from_numpy(rows[np.flatnonzero(seg.loss_mask[1:])]))
            drift += segment_drift(seg, smp)
            c, t = retokenize_mismatch(seg, renderer.encode, renderer.decode)
            changed, total = changed + c, total + t
            replayed += stats.replayed_rows
            compared += stats.compared_slots
            disagree += stats.disagreeing_slots
    dn, dr, fl = torch.cat(d_no), torch.cat(d_r3), torch.cat(flipped)
    longest = max((s for tr, _ in runs for s in tr.segments), key=lambda s: s.num_tokens)
    model.train()
    step_no, step_r3 = time_steps(model, longest, args.time_reps)
    cfg = model.config
    result = {
        "machine": (torch.cuda.get_device_name() if args.device.startswith("cuda") else
                    f"{cpu_name()}, {torch.get_num_threads()} torch thread ({platform.node()})"),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": {"layers": cfg.num_hidden_layers, "experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok,
                  "hidden": cfg.hidden_size, "vocab": cfg.vocab_size},
        "episodes": len(runs), "turns": sum(len(s) for _, sm in runs for s in sm),
        "tokens": int(sum(tr.num_tokens for tr, _ in runs)), "loss_tokens": int(dn.numel()),
        "mean_abs_dlogp_no_r3": float(dn.mean()), "mean_abs_dlogp_r3": float(dr.mean()),
        "max_abs_dlogp_no_r3": float(dn.max()), "max_abs_dlogp_r3": float(dr.max()),
        "r3_reduction": float(1 - dr.mean() / dn.mean()) if float(dn.mean()) > 0 else 0.0,
        "flipped_loss_tokens": int(fl.sum()),
        "mean_abs_dlogp_flipped_no_r3": float(dn[fl].mean()) if fl.any() else 0.0,
        "mean_abs_dlogp_flipped_r3": float(dr[fl].mean()) if fl.any() else 0.0,
        "router_disagreement_rate": disagree / compared if compared else 0.0, "replayed_rows": replayed,
        "drift_tokens": drift, "repaired_turns": sum(tr.tito.repaired_turns for tr, _ in runs),
        "template_mismatches": sum(tr.tito.template_mismatches for tr, _ in runs),
        "retokenize_mismatch_rate": rate(changed, total),
        "step_s_no_r3": step_no, "step_s_r3": step_r3, "replay_overhead": step_r3 / step_no - 1,
        "step_tokens": longest.num_tokens, "rollout_s": rollout_s,
    }
    print(f"{result['machine']}: {result['episodes']} episodes, {result['turns']} turns, {result['tokens']} tokens "
          f"({result['loss_tokens']} sampled), model {result['model']}, {args.dtype}")
    print(f"{'':<26}{'no R3':>12}{'R3':>12}{'ratio':>10}")
    for name, a, b in (("mean |dlogp|", result["mean_abs_dlogp_no_r3"], result["mean_abs_dlogp_r3"]),
                       ("max |dlogp|", result["max_abs_dlogp_no_r3"], result["max_abs_dlogp_r3"]),
                       ("mean |dlogp| flipped rows", result["mean_abs_dlogp_flipped_no_r3"],
                        result["mean_abs_dlogp_flipped_r3"]),
                       ("fwd+bwd step s (median)", step_no, step_r3)):
        print(f"{name:<26}{a:>12.5g}{b:>12.5g}{(b / a if a else float('nan')):>10.3f}")
    for key in ("flipped_loss_tokens", "router_disagreement_rate", "drift_tokens", "repaired_turns", "template_mismatches",
                "retokenize_mismatch_rate", "r3_reduction", "replay_overhead"):
        print(f"{key:<26}{result[key]:>12.4g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
