"""The fidelity bench's command line: one measured setting, or the sweep (`--sweep`).

    python -m bench.fidelity --out FILE [--trained DIR|none] [--preset tiny --episodes 4 --turns 4 ...]

By default the measured model is the learning run's policy (`make run`: the newest published version
under the newest .t1/runs/local-<n>/trainer/weights), so R3 is measured on a trained router; the random-init model of
the same
preset is the second row (`random_init` in the JSON). Without a learning run, only the random-init row.
    python -m bench.fidelity --sweep --out FILE [--sweep-shapes ... --sweep-scales ...]

Arrows run one way: cli -> sweep -> measure.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from bench.fidelity.measure import (
    DEFAULT_NOTE,
    INIT_ROUTER_SCALE,
    make_model,
    measure,
    print_result,
)
from bench.fidelity.sweep import run_sweep
from bench.machine_info import machine

DEFAULT_TRAINED = "newest"  # the newest learning run's published policy versions (`make run`)
RUNS_DIR = Path(".t1/runs")


def newest_weights(runs_dir: Path = RUNS_DIR) -> Path:
    """The weights folder of the newest numbered learning run (`<runs_dir>/local-<n>/trainer/weights`)."""
    runs = [p for p in runs_dir.glob("local-*") if p.name.rsplit("-", 1)[-1].isdigit()]
    runs.sort(key=lambda p: int(p.name.rsplit("-", 1)[-1]))
    return runs[-1] / "trainer" / "weights" if runs else runs_dir / "local-1" / "trainer" / "weights"


def trained_model(arg: str) -> Path | None:
    """The trained model folder `--trained` names: a model folder, the newest v* of a weights folder, or None."""
    if arg == "none":
        return None
    path = newest_weights() if arg == DEFAULT_TRAINED else Path(arg)
    if (path / "config.json").is_file():
        return path
    versions = sorted((p for p in path.glob("v*") if (p / "config.json").is_file() and p.name[1:].isdigit()),
                      key=lambda p: int(p.name[1:])) if path.is_dir() else []
    if versions:
        return versions[-1]
    if arg != DEFAULT_TRAINED:
        raise SystemExit(f"--trained {arg}: neither a model folder nor a weights folder with v* versions")
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sweep", action="store_true", help="sweep router sharpness x model size (sweep.py)")
    p.add_argument("--sweep-shapes", default="3x8x2,4x64x8,8x128x8", help="LAYERSxEXPERTSxTOP_K, comma separated")
    p.add_argument("--sweep-scales", default="2,0.5,0.1", help="router logit stds, comma separated")
    p.add_argument("--preset", default="tiny", choices=["tiny", "small", "learn"],
                   help="random-init preset (with a trained model: the trained model's own preset)")
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
    p.add_argument("--router-scale", type=float, default=INIT_ROUTER_SCALE,
                   help="std of the router logits (init_model: 2.0; smaller = more near ties)")
    p.add_argument("--moe-scale", type=float, default=1.0,
                   help="multiply expert down projections (MoE update vs residual stream; 1 = HF init)")
    p.add_argument("--sweep-moe-scales", default="1", help="moe scales to sweep, comma separated")
    p.add_argument("--sweep-append", action="store_true", help="add the rows to an existing --out sweep file")
    p.add_argument("--time-reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--model-dir", type=Path, help="reuse this folder instead of a fresh temp one")
    p.add_argument("--trained", default=DEFAULT_TRAINED,
                   help="a trained model folder, or a trainer weights folder (its newest v*); 'none': random-init only")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.sweep:
        return run_sweep(args)
    trained = trained_model(args.trained)
    if trained is not None:
        args.preset = json.loads((trained / "t1_model.json").read_text()).get("preset", args.preset)
    with tempfile.TemporaryDirectory(prefix="t1-fidelity-") as tmp:
        model_dir = make_model(args.model_dir or Path(tmp) / "model", args)
        random_init = measure(model_dir, args, schedule_check=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    note = DEFAULT_NOTE if (args.preset, args.router_scale, args.moe_scale) == ("tiny", INIT_ROUTER_SCALE, 1.0) else ""
    result: dict = {"machine": machine(args.device), "settings": settings, "note": note}
    if trained is None:
        result |= {"model_source": "random-init", **random_init}
    else:
        figures = measure(trained, args, schedule_check=True)
        result |= {"model_source": f"trained: {trained}", **figures,
                   "random_init": {"model_source": "random-init", **random_init}}
    print_result(result, args.dtype)
    if "random_init" in result:
        print("random-init row (same preset, same episodes):")
        print_result({**result, **result["random_init"]}, args.dtype)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


