"""The CI learning gate: a short learning run whose bar is calibrated over seeds, and the breaks it must catch.

    python -m bench.learning_gate --out bench/results/learning_gate_cpu.json --seeds 0-9 \\
        --breaks none,loss_sign,reward_zero,routing_layer

The run is bench/learning_gate.yaml through a real `t1-coordinator` (bench/learning.py's one_run): one family of
the curriculum with a choice only the reward reveals (retry_fetch: call the tool with `--wait`, or without it and
hope it answers), demonstrations of both ways, a short SFT, eval `warm_start`, PPO, eval `rl` on the same held-out
tasks. It measures what only RL can teach here: at least CHOICE_BAR of rl's held-out attempts must take the way the
reward pays (`--wait`) at their first command, where imitation reproduces the demonstrations' mixture (under half
take it), and the solve rate must not fall by more than MAX_SOLVE_DROP, with TITO drift 0, routing replay coverage
1.0 and no infra errors.
tests/coordinator/test_learning_gate.py runs it at seed 0 in the default suite.

A break is a one-line change to T1's code, applied to a copy of the t1 package that the run's processes import
(PYTHONPATH) instead of this checkout's; the checkout is not touched. A gate that passes a break is no gate:
- `loss_sign`: PPO's surrogate loss with its sign flipped (the policy descends the advantage);
- `reward_zero`: the trainer places no reward on any token (every return and advantage 0);
- `routing_layer`: routing replay forces each MoE layer to the experts recorded for the next layer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from bench.learning import one_run
from bench.machine_info import describe, machine

ROOT = Path(__file__).resolve().parents[1]
GATE_CONFIG = Path(__file__).with_name("learning_gate.yaml")
PAID_WAY = "--wait"  # the word of the first command that only the reward shows pays
# Calibrated (docs/learning.md, The learning gate): rl's share of held-out attempts whose first command takes the
# paid way (the demonstrations that SFT and PPO-ptx imitate take it in 42-47%), and how far its solve rate may fall
# below the warm start's on the same tasks (a guard against a policy that learnt the choice and lost the rest).
CHOICE_BAR = 0.65
MAX_SOLVE_DROP = 0.05

# name -> (file under t1/, the exact text, what replaces it): each text must occur once.
BREAKS: dict[str, tuple[str, str, str]] = {
    "loss_sign": ("trainer/losses.py", "surrogate = -weights * torch.minimum(",
                  "surrogate = weights * torch.minimum("),
    "reward_zero": ("trainer/advantages.py", "    last = _last_action(loss_masks)\n    if last is None:\n",
                    "    last = None\n    if last is None:\n"),
    "routing_layer": ("routing/replay.py", "        rec_NK = self.index_NLK[:, router.layer]\n",
                      "        rec_NK = self.index_NLK[:, (router.layer + 1) % self.index_NLK.shape[1]]\n"),
}


def broken_tree(dest: Path, name: str) -> Path:
    """A copy of the t1 package under `dest` with break `name` applied; returns the folder to put on PYTHONPATH."""
    if name not in BREAKS:
        raise ValueError(f"no break {name!r} (known: {', '.join(sorted(BREAKS))})")
    rel, old, new = BREAKS[name]
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(ROOT / "t1", dest / "t1", ignore=shutil.ignore_patterns("__pycache__"))
    target = dest / "t1" / rel
    text = target.read_text()
    if text.count(old) != 1:
        raise ValueError(f"break {name}: t1/{rel} holds {text.count(old)} copies of {old!r}, not 1: the code moved, "
                         "update BREAKS")
    target.write_text(text.replace(old, new))
    return dest


def first_command_share(job_dir: Path, marker: str) -> dict[str, Any]:
    """Of an eval job's attempts (`<job_dir>/<task>/<episode>.md` transcripts), how many ran a first command that
    holds `marker` (pure but for reading the files)."""
    attempts = took = 0
    for transcript in sorted(job_dir.glob("*/*.md")) if job_dir.is_dir() else []:
        first = _FIRST_COMMAND.search(transcript.read_text(errors="replace"))
        attempts += 1
        took += first is not None and marker in first.group(1).split()
    return {"took": took, "attempts": attempts, "share": took / attempts if attempts else None}


_FIRST_COMMAND = re.compile(r"^### \$ (.*)$", re.MULTILINE)


def gate_verdict(run: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """Whether one gate run passes (pure): rl takes the paid way first in at least CHOICE_BAR of its attempts, its
    solve rate is at most MAX_SOLVE_DROP below the warm start's, TITO drift 0, routing replay coverage 1.0, no infra
    errors."""
    rows, choice = run["rows"], run["choice"]
    if run["rc"] != 0 or not all(label in rows and choice[label]["share"] is not None
                                 for label in ("warm_start", "rl")):
        return {"lift": None, "choice_gain": None, "passes": False,
                "why": f"run failed (rc {run['rc']}, evals {sorted(rows)})"}
    lift = rows["rl"]["solve_rate"] - rows["warm_start"]["solve_rate"]
    gain = choice["rl"]["share"] - choice["warm_start"]["share"]
    fidelity = report.get("fidelity", {})
    share = choice["rl"]["share"]
    why = [] if share >= CHOICE_BAR else [f"rl's {PAID_WAY} share of first commands {share:.3f} < {CHOICE_BAR}"]
    why += [] if lift >= -MAX_SOLVE_DROP else [f"solve rate {lift:+.3f} from the warm start's, below -{MAX_SOLVE_DROP}"]
    why += [] if run["tito_drift_tokens"] == 0 else [f"TITO drift {run['tito_drift_tokens']} tokens"]
    why += [] if run["infra_errors"] == 0 else [f"{run['infra_errors']} infra errors"]
    coverage = fidelity.get("t1_routing_replay_coverage")
    why += [] if coverage == 1.0 else [f"routing replay coverage {coverage}"]
    return {"lift": lift, "choice_gain": gain, "passes": not why, "why": "; ".join(why),
            "router_disagreement": fidelity.get("t1_router_disagreement_rate")}


def imported_t1(env: dict[str, str], cwd: Path) -> Path:
    """The t1 package that a `python -m` child with this environment and working directory imports."""
    out = subprocess.run([sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec('t1').origin)"],
                         env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).parent


def gate_run(root: Path, seed: int, broken: str = "none", timeout_s: float = 1200.0,
             config: Path = GATE_CONFIG) -> dict[str, Any]:
    """One gate run in `root` (its model, tasks, run and trainer dirs) at `seed`, with break `broken` or none.
    `root` is made afresh (no report of an earlier run can stand in for this one's). Its processes start in `root`,
    so `python -m` imports the t1 of PYTHONPATH or of the installed package, not a t1 in the caller's folder."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = dict(os.environ)
    if broken != "none":
        tree = broken_tree(root / "broken", broken)
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
        if imported_t1(env, root) != tree / "t1":
            raise RuntimeError(f"break {broken}: the run would import {imported_t1(env, root)}, not {tree / 't1'}")
    cfg = yaml.safe_load(config.read_text())
    run = one_run(cfg, root, seed, cfg["reward"]["mode"], timeout_s, env=env, cwd=root)
    return scored(run, root, broken)


def scored(run: dict[str, Any], root: Path, broken: str) -> dict[str, Any]:
    """A finished gate run (bench/learning.py's one_run, which read its eval rows) with the choice shares of its
    evals and the gate's verdict in place of the learning run's."""
    report_file = root / "run" / "report.json"
    report = json.loads(report_file.read_text()) if report_file.is_file() else {}
    rows = {label: row for label, row in run["rows"].items() if label in ("warm_start", "rl")}
    choice = {label: first_command_share(root / "run" / "transcripts" / "eval" /
                                         str(report[label]["heldout"].get("job_id", "")), PAID_WAY)
              for label in rows}
    run = {**run, "rows": rows, "choice": choice, "break": broken}
    for key in ("lift", "meets", "why"):
        run.pop(key, None)
    return {**run, **gate_verdict(run, report)}


def seeds_arg(text: str) -> list[int]:
    """`0-9` or `0,3,5` (pure)."""
    if "-" in text:
        lo, hi = text.split("-", 1)
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def print_rows(runs: list[dict[str, Any]]) -> None:
    print(f"{'break':<14}{'seed':>5}{'solve warm':>11}{'rl':>7}{'lift':>8}{'wait warm':>10}{'rl':>7}{'gain':>8}"
          f"{'passes':>8}{'disagree':>10}{'wall s':>8}")

    def cell(value: float | None, width: int, sign: str = "") -> str:
        return f"{value:>{sign}{width}.3f}" if value is not None else f"{'-':>{width}}"

    for r in runs:
        solve = [r["rows"].get(x, {}).get("solve_rate") for x in ("warm_start", "rl")]
        wait = [r["choice"].get(x, {}).get("share") for x in ("warm_start", "rl")]
        print(f"{r['break']:<14}{r['seed']:>5}{cell(solve[0], 11)}{cell(solve[1], 7)}{cell(r['lift'], 8, '+')}"
              f"{cell(wait[0], 10)}{cell(wait[1], 7)}{cell(r['choice_gain'], 8, '+')}"
              f"{('yes' if r['passes'] else 'no'):>8}{cell(r.get('router_disagreement'), 10)}{r['wall_s']:>8.0f}")
        if r["why"]:
            print(f"    {r['why']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,1")
    p.add_argument("--breaks", default="none", help=f"none and/or {','.join(BREAKS)}")
    p.add_argument("--break-seeds", default="0", help="the seeds of the broken runs")
    p.add_argument("--config", type=Path, default=GATE_CONFIG)
    p.add_argument("--root", type=Path, default=Path(".t1/learning-gate"))
    p.add_argument("--timeout-s", type=float, default=1200.0, help="per run")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (2 on 2 cores: a run beside the others, as the "
                                                         "gate runs beside the rest of the suite)")
    args = p.parse_args(argv)
    info: dict[str, Any] = {**machine(), "loadavg_start": os.getloadavg(), "jobs": args.jobs}
    args.root.mkdir(parents=True, exist_ok=True)
    args.root.chmod(0o711)  # sandbox users traverse to their trees
    plan = [(broken, seed) for broken in args.breaks.split(",")
            for seed in seeds_arg(args.seeds if broken == "none" else args.break_seeds)]

    def run(item: tuple[str, int]) -> dict[str, Any]:
        broken, seed = item
        out = gate_run(args.root / f"{broken}-s{seed}", seed, broken, args.timeout_s, args.config)
        print_rows([out])
        sys.stdout.flush()
        return out

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(run, plan))
    info["loadavg_end"] = os.getloadavg()
    print(describe(info), f"load average {info['loadavg_start'][0]:.1f} -> {info['loadavg_end'][0]:.1f}")
    print_rows(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": info, "config": str(args.config), "choice_bar": CHOICE_BAR,
                                    "max_solve_drop": MAX_SOLVE_DROP,
                                    "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
