"""Where a turn's coordinator CPU goes: the load run with parts of the turn switched off, interleaved.

    .venv/bin/python -m bench.load.ablate --scale 3000 --rounds 2 --out FILE [bench.load flags]

Each variant is the load run (`bench.load`, its own process, peers and all) with extra flags; the
default variants switch off, one at a time and then together, the parts a turn can do without:

    full          everything on (the journal, 48 x top-8 routing, transcripts)
    no-journal    `--no-journal`: the trajectory arrays stay in memory, nothing is written per turn
    no-routing    `--layers 1 --top-k 1`: one byte of routing a token instead of 384
    no-transcript `--no-transcripts`
    floor         all three off: what the turn's SSH command, generate call, TITO buffer, scheduler and
                  metrics cost alone

Rounds run every variant once, in order, so a drift of the machine's speed spreads over all of them;
the table gives each variant's median coordinator CPU per turn and its difference from the first
variant's median. One load run takes its warm-up, window and ramp (about 3 minutes at 3,000).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rich.console import Console
from rich.table import Table

from bench.machine_info import machine

REPO_ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {"full": "", "no-journal": "--no-journal", "no-routing": "--layers 1 --top-k 1",
            "no-transcript": "--no-transcripts", "floor": "--no-journal --layers 1 --top-k 1 --no-transcripts"}


def parse_variants(spec: str) -> dict[str, list[str]]:
    """`name=flags;name=flags` (flags split on spaces), or the names of the built-in variants, comma-separated."""
    out: dict[str, list[str]] = {}
    for item in (s.strip() for s in (spec.split(";") if "=" in spec else spec.split(","))):
        if not item:
            continue
        name, eq, flags = item.partition("=")
        if not eq:
            if name not in VARIANTS:
                raise ValueError(f"--variants: unknown variant {name!r} (built in: {', '.join(VARIANTS)})")
            flags = VARIANTS[name]
        out[name.strip()] = flags.split()
    if not out:
        raise ValueError("--variants: no variant given")
    return out


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=int, default=3000, help="concurrent episodes of every run")
    p.add_argument("--rounds", type=int, default=2, help="times every variant runs, interleaved")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="built-in variant names, comma-separated, or 'name=flags;name=flags' (the first is the "
                        "reference)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args, rest = p.parse_known_args(argv)
    if args.rounds < 1 or args.scale < 1:
        p.error("--rounds and --scale must be >= 1")
    if any(a == "--scales" or a.startswith("--scales=") or a == "--out" for a in rest):
        p.error("--scales and --out of the load runs are set here (--scale, and a file of each run's own)")
    try:
        args.variant_flags = parse_variants(args.variants)
    except ValueError as exc:
        p.error(str(exc))
    return args, rest


def one_run(flags: list[str], scale: int, rest: list[str], out: Path) -> dict[str, Any]:
    """One load run in its own process; its figures at the scale."""
    code = subprocess.run([sys.executable, "-m", "bench.load", *rest, *flags, "--scales", str(scale),
                           "--out", str(out)], cwd=REPO_ROOT).returncode
    if code:
        raise SystemExit(f"bench.load.ablate: a load run with {' '.join(flags) or 'no extra flags'} failed "
                         f"(exit code {code})")
    s = json.loads(out.read_text())["scales"][0]
    return {"cpu_ms_per_turn": s["cpu_ms_per_turn"]["coordinator"], "turns_per_s": s["turns_per_s"],
            "loop_lag_p99_ms": s["loop_lag_ms"].get("p99"), "rss_per_live_episode_kb": s["rss_per_live_episode_kb"],
            "journal_bytes_per_turn": (s.get("journal") or {}).get("bytes_per_turn"), "num_errors": s["num_errors"]}


def summarise(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per variant: the median of each figure over its rounds, and the CPU difference from the first (pure)."""
    rows = []
    reference = None
    for name, rs in runs.items():
        cpu = statistics.median(r["cpu_ms_per_turn"] for r in rs)
        reference = cpu if reference is None else reference
        rows.append({"variant": name, "cpu_ms_per_turn": round(cpu, 3),
                     "cpu_ms_per_turn_runs": [r["cpu_ms_per_turn"] for r in rs],
                     "minus_reference_ms": round(cpu - reference, 3),
                     "turns_per_s": _median(r["turns_per_s"] for r in rs),
                     "loop_lag_p99_ms": _median(r["loop_lag_p99_ms"] for r in rs),
                     "rss_per_live_episode_kb": _median(r["rss_per_live_episode_kb"] for r in rs),
                     "errors": sum(r["num_errors"] for r in rs)})
    return rows


def _median(values: Iterable[float | None]) -> float | None:
    """The median of the figures a run has (a quick run ends with no live episode: no RSS per live episode)."""
    have = [v for v in values if v is not None]
    return round(statistics.median(have), 1) if have else None


def print_table(rows: list[dict[str, Any]], scale: int) -> None:
    table = Table(title=f"coordinator CPU per turn with parts off, {scale} episodes (medians)")
    for col in ("variant", "CPU ms/turn", "runs", "vs first", "turns/s", "lag p99 ms", "RSS KB/episode", "errors"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in rows:
        runs = " ".join(f"{c:.3f}" for c in r["cpu_ms_per_turn_runs"])
        table.add_row(r["variant"], f"{r['cpu_ms_per_turn']:.3f}", runs, f"{r['minus_reference_ms']:+.3f}",
                      str(r["turns_per_s"]), str(r["loop_lag_p99_ms"]), str(r["rss_per_live_episode_kb"]),
                      str(r["errors"]))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    args, rest = parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.variant_flags}
    with tempfile.TemporaryDirectory(prefix="t1-load-ablate-") as tmp:
        for rnd in range(args.rounds):
            for name, flags in args.variant_flags.items():
                runs[name].append(one_run(flags, args.scale, rest, Path(tmp) / f"{name}-{rnd}.json"))
    rows = summarise(runs)
    print_table(rows, args.scale)
    if args.out:
        out = {"benchmark": "load_ablate", "machine": machine(),
               "settings": {"scale": args.scale, "rounds": args.rounds, "load_flags": rest,
                            "variants": {k: " ".join(v) for k, v in args.variant_flags.items()}},
               "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows, "runs": runs}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
