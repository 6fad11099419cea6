"""`t1 tasks oracle|verify|validate|synth|decontam`: run, check, synthesize and decontaminate task folders."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from t1.cli.common import add_config_args, config_or_exit

EXIT_BAD_TASK = 2


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tasks", help="Run, validate, synthesize and decontaminate tasks.")
    cmds = parser.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    for name, help_text in (("oracle", "Run each task's reference solution, then its verifiers, in a fresh sandbox."),
                            ("verify", "Run the verifiers on an untouched sandbox; flags tasks that pass without "
                                       "work.")):
        p = cmds.add_parser(name, help=help_text)
        p.add_argument("dirs", nargs="+", metavar="DIR", help="Task folders or folders of task folders.")
        p.add_argument("--json", action="store_true", help="One JSON object per task per line.")
        p.add_argument("--concurrency", type=int, default=2, help="Tasks run at once (default 2).")
        p.add_argument("--reward-mode", choices=("count", "fraction", "binary"), default=None,
                       help="Reward reported (default: reward.mode from the config).")
        add_config_args(p)
        p.set_defaults(func=_run, mode=name)
    v = cmds.add_parser("validate", help="Predict whether each task will run here: exit 0 ok, 1 will not run "
                                         "here (or has no reference solution), 2 malformed.")
    v.add_argument("dirs", nargs="+", metavar="DIR")
    v.add_argument("--json", action="store_true", help="One JSON object per task per line.")
    v.set_defaults(func=_validate)
    s = cmds.add_parser("synth", help="Write a synthesized Harbor-format task corpus.")
    s.add_argument("--out", required=True, metavar="DIR")
    s.add_argument("--n", type=int, required=True, metavar="N")
    s.add_argument("--seed", type=int, default=0, metavar="S")
    s.add_argument("--split", choices=("train", "eval"), default="train")
    s.set_defaults(func=_synth)
    d = cmds.add_parser("decontam", help="Flag train tasks that overlap benchmark tasks (n-grams and MinHash).")
    d.add_argument("--train", required=True, metavar="DIR")
    d.add_argument("--against", required=True, nargs="+", metavar="DIR")
    out = d.add_mutually_exclusive_group()
    out.add_argument("--write-clean", metavar="DIR", help="Copy the train tasks that were not flagged here.")
    out.add_argument("--exclusions", metavar="FILE", help="Write the flagged train task ids here, one per line.")
    add_config_args(d)
    d.set_defaults(func=_decontam)


def _load(dirs: list[str]) -> list:
    from t1.tasks.formats.dataset import load_dataset
    from t1.tasks.spec import TaskParseError

    try:
        return load_dataset(dirs)
    except TaskParseError as exc:
        print(f"error: invalid task: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_TASK) from None


def _run(args: argparse.Namespace) -> int:
    from t1.sandbox.factory import build_provider
    from t1.tasks.image.docker_build import EnvironmentBuilder
    from t1.tasks.verify.oracle import RunMode, RunStatus, TaskRun, run_tasks
    from t1.tasks.verify.rewards import RewardMode

    cfg = config_or_exit(args)
    specs = _load(args.dirs)
    mode = RunMode(args.mode)
    reward_mode = RewardMode(args.reward_mode or cfg.reward.mode)

    def show(run: TaskRun) -> None:
        if args.json:
            print(json.dumps(run.as_json()), flush=True)
            return
        shims = f" (offline shims: {', '.join(run.report.shims_used)})" if run.report.shims_used else ""
        why = run.why if not (mode is RunMode.VERIFY and run.status is RunStatus.OK) else ""
        print(f"{run.task:<48} resolved={run.resolved!s:<5} reward={run.reward:<6g} "
              f"passed={run.report.passed}/{run.report.total:<4} {run.status}{shims}"
              + (f"\n    why: {why[:400]}" if why else ""), flush=True)

    async def go() -> list[TaskRun]:
        provider = build_provider(cfg.sandbox, images=EnvironmentBuilder)
        try:
            return await run_tasks(provider, specs, mode, concurrency=max(1, args.concurrency),
                                   reward_mode=reward_mode, on_result=show)
        finally:
            await provider.close()

    runs = asyncio.run(go())
    if mode is RunMode.VERIFY:
        return int(any(r.status is not RunStatus.OK for r in runs))  # incl. passes_without_work
    return int(not all(r.resolved and r.status is RunStatus.OK for r in runs))


def _validate(args: argparse.Namespace) -> int:
    from t1.tasks.formats.dataset import task_dirs
    from t1.tasks.needs.validate import EXIT_CODES, CheckStatus, check_folder
    from t1.tasks.spec import TaskParseError

    try:
        dirs = task_dirs(args.dirs)
    except TaskParseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_TASK
    labels = {CheckStatus.OK: "ok", CheckStatus.WILL_NOT_RUN: "will not run here", CheckStatus.INCOMPLETE: "problems"}
    status = 0
    for d in dirs:
        check = check_folder(d)
        status = max(status, EXIT_CODES[check.status])
        if args.json:
            print(json.dumps(check.as_json()), flush=True)
        elif check.status is CheckStatus.MALFORMED:
            print(f"invalid: {check.error}")
        else:
            print(f"{labels[check.status]}: {d} ({check.format}, {check.steps} step(s))")
            for line in [*map(str, check.needs), *check.problems, *(f"note: {n}" for n in check.notes)]:
                print(f"  {line}")
    return status


def _synth(args: argparse.Namespace) -> int:
    from t1.tasks.synth import synthesize

    if args.n < 1:
        print("error: --n must be >= 1", file=sys.stderr)
        return EXIT_BAD_TASK
    paths = synthesize(Path(args.out), n=args.n, seed=args.seed, split=args.split)
    print(f"wrote {len(paths)} tasks to {args.out}")
    return 0


def _decontam(args: argparse.Namespace) -> int:
    from t1.tasks.synth.decontam import find_overlaps, write_clean_copy, write_exclusions

    cfg = config_or_exit(args)
    train, against = _load([args.train]), _load(args.against)
    hits = find_overlaps(train, against, cfg.tasks.decontam)
    for h in hits:
        fields = " ".join(f"{f}={v:.2f}" for f, v in h.field_overlap)
        print(f"{h.train}\t{h.against}\tngram={h.ngram_overlap:.2f}\tminhash={h.minhash_jaccard:.2f}\t{fields}")
    flagged = len({h.train for h in hits})
    print(f"{flagged} of {len(train)} train tasks overlap {len(against)} benchmark tasks", file=sys.stderr)
    if args.write_clean:
        kept = write_clean_copy(train, hits, Path(args.write_clean))
        print(f"wrote {len(kept)} clean tasks to {args.write_clean}", file=sys.stderr)
    if args.exclusions:
        write_exclusions(hits, Path(args.exclusions))
    return 0
