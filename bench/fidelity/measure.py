"""Fidelity of TITO + R3: sampler logprobs vs the trainer's full-forward logprobs, with and without replay.

    python -m bench.fidelity --out bench/results/fidelity_cpu_tiny.json [--preset tiny --episodes 4 --turns 4]
    python -m bench.fidelity --sweep --out bench/results/fidelity_sweep_cpu.json   # see bench/fidelity/sweep.py

Runs multi-turn episodes with the torch inference backend (KV-cache decoding, routing capture) in
bfloat16 on a random-init MoE from `t1 model init`; observations are real bash output (subprocess).
Trajectories go through the TITO buffer. The trainer-style forward (one full forward per segment,
bfloat16, as in production) scores every loss token with and without routing replay, and a
forward+backward is timed both ways. --experts/--top-k/--layers/--hidden resize the MoE (same
tokenizer); --router-scale sets the router logits' std (init_model uses 2.0). Prints a table and
writes JSON.

A control row replays the sampler's own schedule (prefill of each new prompt chunk, then one decode
step per sampled token, KV cache, recorded routing): it must reproduce the behaviour logprobs
exactly, which shows that the trainer's logprob math (float32 log_softmax of bfloat16 logits,
temperature) equals the sampler's, and that what remains in the full forward is kernel
non-invariance between decode and full-sequence shapes (on CPU: the SDPA attention kernel).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is not on the path

from bench.machine_info import describe
from t1.inference.server.torch_backend import TorchBackend
from t1.inference.types import GenerateRequest, SamplingParams
from t1.routing.block import sentinel
from t1.routing.capture import capture_routing
from t1.routing.fidelity import schedule_logprobs, segment_logprobs
from t1.tito import ChatRenderer, TokenBuffer
from t1.tito.diagnostics import rate, retokenize_mismatch, segment_drift
from t1.trajectory.types import EpisodeStatus, Trajectory

COMMANDS = ("ls -la /", "uname -a", "echo $((RANDOM % 1000)) files", "head -c 300 /etc/os-release",
            "ps -o pid,comm | head -5", "printf 'a\\tb\\n1\\t2\\n'", "date -u", "df -h / | tail -1")
INIT_ROUTER_SCALE = 2.0  # std of router / LM-head logits that t1.model.init gives (`_sharpen`)
Sampled = list[tuple[int, np.ndarray]]  # (prompt length, sampled ids) per turn of a segment


def bash(cmd: str, cap: int = 400) -> str:
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=10)
    return (out.stdout + out.stderr)[:cap]


def resize_model(folder: Path, *, seed: int, layers: int = 0, experts: int = 0, top_k: int = 0, hidden: int = 0,
                 router_scale: float = INIT_ROUTER_SCALE, moe_scale: float = 1.0) -> None:
    """Re-initialise the Qwen3-MoE in `folder` with another shape and router sharpness (tokenizer kept).

    Router weights get std router_scale/sqrt(hidden), so with RMS-normalised inputs the router logits
    have std ~router_scale; the LM head keeps init_model's std 2/sqrt(hidden). moe_scale multiplies
    every expert's down projection: the MoE block's update then weighs moe_scale times more against
    the residual stream (at init it is 1-8% of the residual norm per layer).
    """
    from transformers import AutoConfig, Qwen3MoeForCausalLM

    cfg = AutoConfig.from_pretrained(str(folder))
    for key, val in (("num_experts", experts), ("num_experts_per_tok", top_k),
                     ("num_hidden_layers", layers), ("hidden_size", hidden)):
        if val:
            setattr(cfg, key, val)
    if hidden:
        cfg.moe_intermediate_size = cfg.intermediate_size = hidden
        cfg.head_dim = hidden // cfg.num_attention_heads
    torch.manual_seed(seed)
    model: Any = Qwen3MoeForCausalLM(cfg)
    model = model.to(torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = router_scale if name.endswith("mlp.gate.weight") else INIT_ROUTER_SCALE
            if name.endswith("mlp.gate.weight") or name == "lm_head.weight":
                param.copy_(torch.randn(param.shape, generator=gen) * scale / cfg.hidden_size**0.5)
            elif name.endswith("mlp.experts.down_proj"):
                param.mul_(moe_scale)
    model.save_pretrained(str(folder))


def make_model(out: Path, args: argparse.Namespace) -> Path:
    """A random-init Qwen3-MoE folder from `t1 model init`, resized when asked (same tokenizer)."""
    from t1.model.init import init_model

    init_model(out, args.preset, seed=args.seed)
    if (any((args.experts, args.top_k, args.layers, args.hidden)) or args.router_scale != INIT_ROUTER_SCALE
            or args.moe_scale != 1.0):
        resize_model(out, seed=args.seed, layers=args.layers, experts=args.experts, top_k=args.top_k,
                     hidden=args.hidden, router_scale=args.router_scale, moe_scale=args.moe_scale)
    return out


def copy_model(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


async def run_episode(backend: TorchBackend, renderer: ChatRenderer, args: argparse.Namespace,
                      episode: int) -> tuple[Trajectory, list[Sampled]]:
    buf = TokenBuffer(renderer, [
        {"role": "system", "content": "You are a terminal agent. Run one shell command per turn."},
        {"role": "user", "content": "Find out what system this is and how many files / holds."}])
    sampled: list[Sampled] = [[]]
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


def step_clock(device: str) -> tuple[str, Any]:
    """The clock for step timing: wall time on a GPU (synchronised); on CPU the process's CPU time, which
    other jobs on a shared machine do not inflate (torch runs single-threaded here)."""
    if device.startswith("cuda"):
        return "wall", time.perf_counter
    return "process_cpu", time.process_time


def time_steps(model: torch.nn.Module, seg: Any, reps: int, device: str) -> tuple[float, float]:
    """Median seconds of one forward+backward (sum of loss-token logprobs) on a segment, without and
    with replay; the two are interleaved so machine noise hits both alike."""
    _, clock = step_clock(device)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * reps + 2):
        replay = bool(i % 2)
        model.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = clock()
        logp, _ = segment_logprobs(model, seg, replay=replay, grad=True)
        logp.sum().backward()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i >= 2:  # first pair warms up
            times[replay].append(clock() - t0)
    return statistics.median(times[False]), statistics.median(times[True])


def flipped_rows(live_SLK: np.ndarray, record_SLK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flipped [S, L], recorded [S, L]): rows whose live expert set differs from a present record."""
    recorded = ~(record_SLK == sentinel(record_SLK.dtype)).all(-1)
    flipped = (np.sort(live_SLK.astype(np.int64), -1) != np.sort(record_SLK.astype(np.int64), -1)).any(-1)
    return flipped & recorded, recorded


def reduction_ci(d_no: np.ndarray, d_r3: np.ndarray, reps: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% paired-bootstrap interval over loss tokens of 1 - mean|dlogp| with R3 / without."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d_no.shape[0], (reps, d_no.shape[0]))
    red = 1 - d_r3[idx].mean(1) / np.maximum(d_no[idx].mean(1), 1e-30)
    lo, hi = np.percentile(red, [2.5, 97.5])
    return float(lo), float(hi)


def moe_residual_share(model: Any, tokens: int = 128, seed: int = 0) -> list[float]:
    """Per layer, mean norm of the MoE block's output / mean norm of the residual entering the layer
    (random ids): how far a change of experts can move the residual stream."""
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []

    def layer_in(module: Any, args: tuple, kwargs: dict) -> None:
        inputs.append((args[0] if args else kwargs["hidden_states"]).float().norm(dim=-1).mean())

    def moe_out(module: Any, args: tuple, out: Any) -> None:
        outputs.append((out[0] if isinstance(out, tuple) else out).float().norm(dim=-1).mean())

    handles = [h for layer in model.model.layers for h in (
        layer.register_forward_pre_hook(layer_in, with_kwargs=True), layer.mlp.register_forward_hook(moe_out))]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(next(model.parameters()).device)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    return [round(float(o / i), 4) for o, i in zip(outputs, inputs, strict=True)]


def measure(model_dir: Path, args: argparse.Namespace, *, schedule_check: bool) -> dict[str, Any]:
    """Roll out episodes on the torch backend, then score them trainer-style; the result's figures."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
    renderer = ChatRenderer(tokenizer, end_of_turn=tokenizer.eos_token)

    async def episodes() -> list[tuple[Trajectory, list[Sampled]]]:
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
    d_no, d_r3, d_sched, flipped = [], [], [], []
    drift = changed = total = replayed = compared = disagree = rows_flipped = rows_recorded = 0
    for traj, sampled in runs:
        for seg, smp in zip(traj.segments, sampled, strict=True):
            assert seg.routing is not None
            behaviour = torch.from_numpy(seg.logprobs[seg.loss_mask]).to(args.device)
            with capture_routing(model) as live:
                no, _ = segment_logprobs(model, seg, replay=False)
            r3, stats = segment_logprobs(model, seg, replay=True)
            assert stats is not None
            d_no.append((no - behaviour).abs().cpu())
            d_r3.append((r3 - behaviour).abs().cpu())
            if schedule_check:
                d_sched.append((schedule_logprobs(model, seg, smp) - behaviour).abs().cpu())
            rows, recorded = flipped_rows(live.concatenated(), seg.routing[:-1])
            rows_flipped, rows_recorded = rows_flipped + int(rows.sum()), rows_recorded + int(recorded.sum())
            # A loss token at p is scored from row p-1: flipped if any layer's experts differ there.
            flipped.append(torch.from_numpy(np.asarray(rows.any(-1))[np.flatnonzero(seg.loss_mask[1:])]))
            drift += segment_drift(seg, smp)
            c, t = retokenize_mismatch(seg, renderer.encode, renderer.decode)
            changed, total = changed + c, total + t
            replayed += stats.replayed_rows
            compared += stats.compared_slots
            disagree += stats.disagreeing_slots
    dn, dr, fl = torch.cat(d_no), torch.cat(d_r3), torch.cat(flipped)
    longest = max((s for tr, _ in runs for s in tr.segments), key=lambda s: s.num_tokens)
    model.train()
    step_no, step_r3 = time_steps(model, longest, args.time_reps, args.device)
    cfg = model.config
    mean_no, mean_r3 = float(dn.mean()), float(dr.mean())
    result: dict[str, Any] = {
        "model": {"layers": cfg.num_hidden_layers, "experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok,
                  "hidden": cfg.hidden_size, "vocab": cfg.vocab_size, "router_scale": args.router_scale,
                  "moe_scale": args.moe_scale, "moe_residual_share": moe_residual_share(model)},
        "episodes": len(runs), "turns": sum(len(s) for _, sm in runs for s in sm),
        "tokens": int(sum(tr.num_tokens for tr, _ in runs)), "loss_tokens": int(dn.numel()),
        "mean_abs_dlogp_no_r3": mean_no, "mean_abs_dlogp_r3": mean_r3,
        "max_abs_dlogp_no_r3": float(dn.max()), "max_abs_dlogp_r3": float(dr.max()),
        "r3_reduction": 1 - mean_r3 / mean_no if mean_no > 0 else 0.0,
        "r3_reduction_ci95": reduction_ci(dn.numpy(), dr.numpy()),
        "flipped_loss_tokens": int(fl.sum()), "flipped_loss_token_share": float(fl.float().mean()),
        "mean_abs_dlogp_flipped_no_r3": float(dn[fl].mean()) if fl.any() else 0.0,
        "mean_abs_dlogp_flipped_r3": float(dr[fl].mean()) if fl.any() else 0.0,
        "router_disagreement_rate": disagree / compared if compared else 0.0,
        "router_row_flip_rate": rate(rows_flipped, rows_recorded), "replayed_rows": replayed,
        "drift_tokens": drift, "repaired_turns": sum(tr.tito.repaired_turns for tr, _ in runs),
        "template_mismatches": sum(tr.tito.template_mismatches for tr, _ in runs),
        "retokenize_mismatch_rate": rate(changed, total),
        "step_s_no_r3": step_no, "step_s_r3": step_r3, "replay_overhead": step_r3 / step_no - 1,
        "step_clock": step_clock(args.device)[0],
        "step_tokens": longest.num_tokens, "rollout_s": rollout_s,
    }
    if schedule_check:
        ds = torch.cat(d_sched)
        result["mean_abs_dlogp_schedule_r3"] = float(ds.mean())
        result["max_abs_dlogp_schedule_r3"] = float(ds.max())
    return result


DEFAULT_NOTE = (
    "Default setting: `t1 model init --preset tiny` as shipped (3 layers x 8 experts x top-2, router and LM-head "
    "logits of std 2), the model the rest of T1's tests use. Routing flips are rare there (few experts, shallow) "
    "and at HF init an expert swap barely moves the residual stream, so the mean |dlogp| is the non-routing error: "
    "decode-vs-full-forward kernel numerics (mean_abs_dlogp_schedule_r3 = 0 shows the logprob math itself "
    "matches). bench/results/fidelity_sweep_cpu.json shows how R3's share grows with the flip rate and the "
    "experts' weight.")


def print_result(result: dict[str, Any], dtype: str) -> None:
    print(f"{describe(result['machine'])}: {result['episodes']} episodes, {result['turns']} turns, {result['tokens']} "
          "tokens "
          f"({result['loss_tokens']} sampled), model {result['model']}, {dtype}")
    print(f"{'':<34}{'no R3':>12}{'R3':>12}{'ratio':>10}")
    rows = [("mean |dlogp|", result["mean_abs_dlogp_no_r3"], result["mean_abs_dlogp_r3"]),
            ("max |dlogp|", result["max_abs_dlogp_no_r3"], result["max_abs_dlogp_r3"]),
            ("mean |dlogp| flipped rows", result["mean_abs_dlogp_flipped_no_r3"],
             result["mean_abs_dlogp_flipped_r3"]),
            ("fwd+bwd step s (median)", result["step_s_no_r3"], result["step_s_r3"])]
    for name, a, b in rows:
        print(f"{name:<34}{a:>12.5g}{b:>12.5g}{(b / a if a else float('nan')):>10.3f}")
    keys = ["flipped_loss_token_share", "router_disagreement_rate", "router_row_flip_rate", "drift_tokens",
            "repaired_turns", "template_mismatches", "retokenize_mismatch_rate", "r3_reduction", "replay_overhead",
            "mean_abs_dlogp_schedule_r3", "max_abs_dlogp_schedule_r3"]
    for key in keys:
        if key in result:
            print(f"{key:<34}{result[key]:>12.4g}")
    print(result["note"])
