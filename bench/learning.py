"""The learning run (examples/local.yaml) for several seeds, with the count reward and the binary
reward side by side: does RL lift the held-out solve rate over the warm start, and does the dense reward help?

    python -m bench.learning --out bench/results/learning_cpu.json [--seeds 0,1] [--rewards count,binary]
    python -m bench.learning --config examples/long.yaml --compaction rule,policy --rewards count \
        --out bench/results/learning_long_cpu.json

Each run is a real `t1-coordinator --config` of the learning config in a folder of its own (model, tasks,
run and trainer dirs), with `seed`, the model's init seed and the trainer seed set to the run's seed,
`reward.mode` to the variant and, with `--compaction`, `rollout.compaction.mode` too (the runs of one seed
then differ in that alone). Runs whose evals recorded segments (the long tier) also report, per policy, turns
and segments per episode (median, p90), the share of compaction summaries that carry what a later step needs,
TITO drift per segment and routing replay coverage (bench/long_horizon.py). The table has, per run, the solve
rate of the three policies on the same held-out attempts (`base` before SFT, `warm_start` after SFT to its
validation plateau, `rl` after PPO) with 95% Wilson intervals, the lift rl - warm_start, whether it meets the
bar (>= 10 points, intervals apart, warm start above base), tito drift, infra errors and wall time; the JSON
names the machine and its load average at the start and end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.long_horizon import long_stats
from bench.machine_info import describe, machine

LABELS = ("base", "warm_start", "rl")
LIFT_POINTS = 0.10


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate (pure)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def policy_row(summary: dict[str, Any], attempts_per_task: int) -> dict[str, Any]:
    """Solve rate, attempts and 95% interval of one eval summary (its own ci95/attempts when it has them)."""
    rate = float(summary["resolve_rate"])
    n = int(summary.get("attempts") or (summary["num_tasks"] * attempts_per_task - summary.get("infra_errors", 0)))
    lo, hi = summary.get("ci95") or wilson(rate * n, n)
    return {"solve_rate": rate, "attempts": n, "ci95": [float(lo), float(hi)],
            "mean_reward": summary.get("mean_reward"), "infra_errors": summary.get("infra_errors", 0)}


def verdict(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Whether one run meets the bar: rl - warm_start >= 10 points, intervals apart, warm_start > base (pure)."""
    if not all(label in rows for label in LABELS):
        return {"lift": None, "meets": False, "why": f"missing evals: {[x for x in LABELS if x not in rows]}"}
    base, warm, rl = (rows[x] for x in LABELS)
    lift = rl["solve_rate"] - warm["solve_rate"]
    apart = rl["ci95"][0] > warm["ci95"][1]
    above = warm["solve_rate"] > base["solve_rate"]
    why = [] if lift >= LIFT_POINTS else [f"lift {lift:+.3f} < {LIFT_POINTS}"]
    why += [] if apart else ["95% intervals overlap"]
    why += [] if above else ["warm start not above base"]
    return {"lift": lift, "meets": not why, "why": "; ".join(why)}


def run_config(base_cfg: dict[str, Any], root: Path, seed: int, reward: str, compaction: str = "") -> dict[str, Any]:
    """The learning config of one run, every path inside `root`; `compaction` ("": the config's) sets
    rollout.compaction.mode."""
    cfg = json.loads(json.dumps(base_cfg))
    cfg["name"] = f"learning-{reward}{f'-{compaction}' if compaction else ''}-s{seed}"
    cfg["seed"] = seed
    cfg["reward"]["mode"] = reward
    if compaction:
        cfg["rollout"].setdefault("compaction", {})["mode"] = compaction
    cfg["sandbox"]["local"]["root"] = str(root / "sandboxes")
    for name, s in cfg["tasks"]["sets"].items():
        s["path"] = str(root / "tasks" / name)
    model = cfg["inference"]["model"]
    model["path"], model["init_seed"] = str(root / "model"), seed
    cfg["trainer"]["work_dir"], cfg["trainer"]["seed"] = str(root / "trainer"), seed
    cfg["trainer"]["warm_start"]["demos_path"] = str(root / "run" / "demos.msgpack")
    cfg["coordinator"].pop("runs_dir", None)  # one run directory, inside root, where the report is looked for
    cfg["coordinator"]["run_dir"] = str(root / "run")
    cfg["coordinator"]["server"]["port"] = 0
    return cfg


def one_run(base_cfg: dict[str, Any], root: Path, seed: int, reward: str, timeout_s: float,
            compaction: str = "", env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """One coordinator run of the config in `root` (`env`: the processes' environment, default this one's; `cwd`:
    their working directory, default this one's)."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = run_config(base_cfg, root, seed, reward, compaction)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    with (root / "coordinator.log").open("wb") as log:
        try:
            rc: int | None = subprocess.run([sys.executable, "-m", "t1.cli.coordinator", "--config", str(path)],
                                            stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s,
                                            cwd=cwd).returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.monotonic() - start
    out: dict[str, Any] = {"seed": seed, "reward": reward, "compaction": cfg["rollout"].get("compaction", {}).get(
        "mode", "rule"), "rc": rc, "wall_s": round(wall, 1), "dir": str(root)}
    report_file = Path(cfg["coordinator"]["run_dir"]) / "report.json"
    if not report_file.is_file():
        return {**out, "rows": {}, **verdict({})}
    report = json.loads(report_file.read_text())
    attempts = cfg["coordinator"]["eval"]["attempts"]
    rows = {label: policy_row(report[label]["heldout"], attempts) for label in LABELS if label in report}
    if any(report.get(label, {}).get("heldout", {}).get("segments") for label in LABELS):
        out["long"] = long_stats(report_file.parent, report, Path(cfg["tasks"]["sets"]["heldout"]["path"]), LABELS)
    return {**out, "rows": rows, **verdict(rows), "sft_curve": report.get("sft_curve", []),
            "sft_kept_step": report.get("sft_kept_step"),
            "tito_drift_tokens": report.get("fidelity", {}).get("t1_tito_drift_tokens"),
            "infra_errors": report.get("rollouts", {}).get("infra_errors")}


def long_lines(long: dict[str, Any]) -> list[str]:
    """The long-horizon lines under a run's row: per policy turns and segments per episode, summaries carried."""
    lines = []
    for label, e in long["evals"].items():
        t, s, c = e["turns"], e["segments"], e["summaries"]
        share = f"{c['carry_share']:.2f}" if c["carry_share"] is not None else "-"
        lines.append(f"    {label:<11} turns/episode {t.get('median', '-')} (p90 {t.get('p90', '-')}), "
                     f"segments/episode {s.get('median', '-')} (p90 {s.get('p90', '-')}, min {s.get('min', '-')}); "
                     f"summaries carrying the early value {c['carried']}/{c['needed']} = {share}, "
                     f"malformed {c['malformed']}")
    lines.append(f"    TITO drift: {long['tito_drift_tokens']} tokens, {long['segments_with_drift']} of "
                 f"{long['segments']} segments; routing replay coverage (lowest step) "
                 f"{long['routing_replay_coverage_min']}")
    return lines


def print_table(runs: list[dict[str, Any]]) -> None:
    head = f"{'reward':<8}{'compact':<8}{'seed':>5}" + "".join(f"{x:>22}" for x in LABELS) + \
        f"{'lift':>8}{'meets':>7}{'drift':>6}{'infra':>6}{'wall s':>8}"
    print(head)
    for r in runs:
        cells = "".join(
            f"{r['rows'][x]['solve_rate']:>6.3f} [{r['rows'][x]['ci95'][0]:.2f},{r['rows'][x]['ci95'][1]:.2f}]"
            f"{r['rows'][x]['attempts']:>4}" if x in r["rows"] else f"{'-':>22}" for x in LABELS)
        lift = f"{r['lift']:+.3f}" if r.get("lift") is not None else "-"
        print(f"{r['reward']:<8}{r.get('compaction', '-'):<8}{r['seed']:>5}{cells}{lift:>8}"
              f"{('yes' if r['meets'] else 'no'):>7}{r.get('tito_drift_tokens', '-')!s:>6}"
              f"{r.get('infra_errors', '-')!s:>6}{r['wall_s']:>8.0f}")
        if r.get("why"):
            print(f"    {r['why']}")
        for line in long_lines(r["long"]) if r.get("long") else []:
            print(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", type=Path, default=Path("examples/local.yaml"))
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--rewards", default="count,binary")
    p.add_argument("--compaction", default="", help="rollout.compaction.mode per run, e.g. rule,policy (default: the "
                                                     "config's)")
    p.add_argument("--root", type=Path, default=Path(".t1/learning"))
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    args = p.parse_args(argv)
    base_cfg = yaml.safe_load(args.config.read_text())
    info: dict[str, Any] = {**machine(), "loadavg_start": os.getloadavg()}
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for reward in args.rewards.split(","):
            for compaction in args.compaction.split(","):
                name = f"{reward}-{compaction}-s{seed}" if compaction else f"{reward}-s{seed}"
                runs.append(one_run(base_cfg, args.root / name, seed, reward, args.timeout_s, compaction))
                print_table(runs[-1:])
    info["loadavg_end"] = os.getloadavg()
    print(describe(info), f"load average {info['loadavg_start'][0]:.1f} -> {info['loadavg_end'][0]:.1f}")
    print_table(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": info, "config": str(args.config), "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
