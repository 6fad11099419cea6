"""The fidelity sweep: how R3's benefit grows with the routing-flip rate (router sharpness x MoE size).

bench/results/fidelity_sweep_cpu.json was built by three runs (each under 6 minutes on 1 core):

    C="--episodes 2 --turns 3 --max-tokens 40 --time-reps 5"
    python -m bench.fidelity --sweep --out bench/results/fidelity_sweep_cpu.json $C \
        --sweep-shapes 3x8x2,4x64x8,8x128x8 --sweep-scales 2,0.5,0.1 --sweep-moe-scales 1
    python -m bench.fidelity --sweep --sweep-append --out bench/results/fidelity_sweep_cpu.json $C \
        --sweep-shapes 3x8x2,4x64x8,8x128x8 --sweep-scales 2 --sweep-moe-scales 4,16
    python -m bench.fidelity --sweep --sweep-append --out bench/results/fidelity_sweep_cpu.json $C \
        --sweep-shapes 16x128x8 --sweep-scales 2 --sweep-moe-scales 1,16

One `t1 model init --preset tiny` folder gives the tokenizer; every setting re-initialises the MoE with
LAYERSxEXPERTSxTOP_K (hidden size of the preset), router logits of std ROUTER_SCALE and expert down
projections times MOE_SCALE, runs the same real episodes on the torch backend in bfloat16 and scores
them trainer-style (bench/fidelity/measure.py). What moves the flip rate is the expert count (smaller
gaps between the k-th and k+1-th router score) and depth (more accumulated bf16 noise); scaling the
router logits scales their gaps and their noise alike. moe_scale sets what a flip costs: at HF init
the MoE update is only 1-8% of the residual norm. Prints a table and writes JSON, one row per setting.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fidelity.measure import INIT_ROUTER_SCALE, copy_model, measure, resize_model
from bench.machine_info import describe, machine

TARGET_REDUCTION = 0.30
DEFAULT_SHAPE = (3, 8, 2)
ROW_KEYS = ("tokens", "loss_tokens", "router_disagreement_rate", "router_row_flip_rate", "flipped_loss_token_share",
            "mean_abs_dlogp_no_r3", "mean_abs_dlogp_r3", "max_abs_dlogp_no_r3", "max_abs_dlogp_r3",
            "r3_reduction", "r3_reduction_ci95",
            "mean_abs_dlogp_flipped_no_r3", "mean_abs_dlogp_flipped_r3", "step_s_no_r3", "step_s_r3",
            "replay_overhead", "step_clock", "drift_tokens", "rollout_s")
PRODUCTION_REFERENCE = {
    "source": "Ma et al. 2025, Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers "
              "(arXiv 2510.11370), Qwen3-30B-A3B (48 MoE layers x 128 experts, top-8), SGLang/vLLM vs Megatron",
    "router_row_flip_rate": 0.10,  # ~10% of (token, layer) routers select different experts
    "flipped_token_share_any_layer": 0.94,  # 94% of tokens differ in at least one layer
    "flipped_routers_per_token": 6,
}
COLUMNS = {
    "router_scale": "std of the router logits (router weight std router_scale/sqrt(hidden)); init_model: 2",
    "moe_scale": "multiplier on expert down projections; 1 = HF init, where the MoE update is 1-8% of the "
                 "residual norm per layer (model.moe_residual_share)",
    "router_disagreement_rate": "share of recorded expert slots the trainer's live top-k does not contain",
    "router_row_flip_rate": "share of (token, MoE layer) rows whose live expert set differs from the record "
                            "(the paper's 'routers that select different experts')",
    "flipped_loss_token_share": "share of loss tokens whose input row has a flip in any layer",
    "r3_reduction": "1 - mean|dlogp| with R3 / without; r3_reduction_ci95: paired bootstrap over loss tokens",
    "replay_overhead": "median fwd+bwd step time with replay / without - 1 (longest segment; "
                       "step_clock: process CPU time on CPU, wall on GPU)",
}
DEFAULT_NOTE = (
    "default = 3x8x2 at router_scale 2, moe_scale 1: exactly `t1 model init --preset tiny` (init_model sharpens "
    "routers to logit std 2), the model T1's tests and bench/results/fidelity_cpu_tiny.json use. Its flip rate is "
    "far below production's (~10% of routers, 94% of tokens), so the other rows vary router sharpness, depth, "
    "experts and top-k (flip rate) and the experts' weight in the residual stream (what a flip costs); "
    "everything else, episodes included, is the same in every row.")


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        layers, experts, top_k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--sweep-shapes entry {text!r} must be LAYERSxEXPERTSxTOP_K, e.g. 8x128x8") from None
    if not 0 < top_k <= experts:
        raise ValueError(f"--sweep-shapes entry {text!r}: top_k must be in 1..experts")
    return layers, experts, top_k


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'shape':<9}{'router':>7}{'moe':>5}{'share':>6}{'tokens':>7}{'slot dis%':>10}{'row flip%':>10}"
            f"{'tok flip%':>10}{'mean noR3':>11}{'mean R3':>10}{'reduct% [95% CI]':>19}{'max noR3':>10}{'max R3':>9}"
            f"{'flipped noR3/R3':>17}{'replay ovh%':>12}")
    print(head)
    for r in rows:
        lo, hi = r["r3_reduction_ci95"]
        red = f"{100 * r['r3_reduction']:.1f} [{100 * lo:.0f},{100 * hi:.0f}]"
        flipped = f"{r['mean_abs_dlogp_flipped_no_r3']:.4f}/{r['mean_abs_dlogp_flipped_r3']:.4f}"
        share = sum(r["model"]["moe_residual_share"]) / len(r["model"]["moe_residual_share"])
        print(f"{r['shape']:<9}{r['router_scale']:>7g}{r['moe_scale']:>5g}{share:>6.2f}{r['tokens']:>7}"
              f"{100 * r['router_disagreement_rate']:>10.3f}{100 * r['router_row_flip_rate']:>10.3f}"
              f"{100 * r['flipped_loss_token_share']:>10.1f}{r['mean_abs_dlogp_no_r3']:>11.5f}"
              f"{r['mean_abs_dlogp_r3']:>10.5f}{red:>19}{r['max_abs_dlogp_no_r3']:>10.4f}{r['max_abs_dlogp_r3']:>9.4f}"
              f"{flipped:>17}{100 * r['replay_overhead']:>12.1f}" + ("  <- default" if r["default"] else ""))


def run_sweep(args: argparse.Namespace) -> int:
    from t1.model.init import init_model

    shapes = [parse_shape(s) for s in args.sweep_shapes.split(",")]
    scales = [float(s) for s in args.sweep_scales.split(",")]
    moe_scales = [float(s) for s in args.sweep_moe_scales.split(",")]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="t1-fidelity-sweep-") as tmp:
        base = init_model(Path(tmp) / "base", "tiny", seed=args.seed)
        for (layers, experts, top_k), moe_scale, scale in itertools.product(shapes, moe_scales, scales):
            is_default = (layers, experts, top_k) == DEFAULT_SHAPE and scale == INIT_ROUTER_SCALE and moe_scale == 1
            folder = copy_model(base, Path(tmp) / "setting")
            if not is_default:
                resize_model(folder, seed=args.seed, layers=layers, experts=experts, top_k=top_k,
                             router_scale=scale, moe_scale=moe_scale)
            args.router_scale, args.moe_scale = scale, moe_scale
            figures = measure(folder, args, schedule_check=False)
            row = {"shape": f"{layers}x{experts}x{top_k}", "router_scale": scale, "moe_scale": moe_scale,
                   "default": is_default, "model": figures["model"], **{k: figures[k] for k in ROW_KEYS}}
            rows.append(row)
            print(f"[{time.perf_counter() - t0:6.0f}s] {row['shape']} router {scale:g} moe {moe_scale:g}: "
                  f"row flips {100 * row['router_row_flip_rate']:.3f}%, reduction {100 * row['r3_reduction']:.1f}%",
                  flush=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                if k not in ("router_scale", "moe_scale", "sweep_append")}
    runs = [{"settings": settings, "sweep_s": time.perf_counter() - t0}]
    if args.sweep_append and args.out.exists():
        previous = json.loads(args.out.read_text())
        rows, runs = previous["rows"] + rows, previous["runs"] + runs
    met = [f"{r['shape']}@router {r['router_scale']:g}/moe {r['moe_scale']:g}" for r in rows
           if r["r3_reduction"] >= TARGET_REDUCTION]
    result = {
        "machine": machine(args.device), "dtype": args.dtype, "runs": runs,
        "default_setting": {"shape": "3x8x2", "router_scale": INIT_ROUTER_SCALE, "moe_scale": 1.0,
                            "why": DEFAULT_NOTE},
        "columns": COLUMNS, "production_reference": PRODUCTION_REFERENCE,
        "target_reduction": TARGET_REDUCTION, "settings_meeting_target": met, "rows": rows,
    }
    print(f"{describe(result['machine'])}, {args.dtype}, {args.episodes} episodes x {args.turns} turns x "
          f"{args.max_tokens} tokens per setting, hidden 64; share = mean MoE update / residual norm")
    print_table(rows)
    print(DEFAULT_NOTE)
    print(f"R3 cuts mean |dlogp| by >= {100 * TARGET_REDUCTION:.0f}% at: {', '.join(met) or 'none'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0
