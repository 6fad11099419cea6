"""`t1 spool check RUN_DIR` and `t1 spool repair RUN_DIR`: inspect and recover a coordinator's spool.

check reads every segment and the ack log without changing anything and prints, per file, the
intact records and each damaged byte range; exit 0 when clean, 1 when damage was found.
repair does what a coordinator start does (takes the run dir's lock, so never under a live
coordinator): damaged files keep their original bytes in a `.corrupt` side file and are rewritten
with their intact records; fully acknowledged segments are removed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from t1.cli.common import EXIT_BAD_STATE
from t1.workdir import DirectoryBusy, DirLock

EXIT_DAMAGED = 1


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("spool", help="Check or repair a run's trajectory spool.")
    cmds = parser.add_subparsers(dest="spool_command", metavar="ACTION", required=True)
    for name, func, text in (("check", _check, "Report damage without changing anything (exit 1 if any)."),
                             ("repair", _repair, "Set damage aside in .corrupt files and keep every intact record.")):
        cmd = cmds.add_parser(name, help=text)
        cmd.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="coordinator.run_dir (or its spool/ folder).")
        cmd.set_defaults(func=func)


def spool_dir(run_dir: Path) -> Path:
    return run_dir / "spool" if (run_dir / "spool").is_dir() else run_dir


def _check(args: argparse.Namespace) -> int:
    from t1.coordinator.spool import spool_recovery as sr
    from t1.trajectory import spool_files as sf

    directory = spool_dir(args.run_dir)
    if not directory.is_dir():
        print(f"error: {directory} is not a directory", file=sys.stderr)
        return EXIT_BAD_STATE
    ack_path = directory / sf.ACK_LOG
    scans = [sr.scan_segment(sf.segment_path(directory, i)) for i in sf.list_segments(directory)]
    ack_scan = sr.scan_acks(ack_path) if ack_path.exists() else None
    acked = {body.decode("utf-8") for _, body in ack_scan.frames} if ack_scan else set()
    pending = 0
    for scan in [*scans, *([ack_scan] if ack_scan else [])]:
        ids = [sf.decode_record(body, scan.path)[0] for _, body in scan.frames] if scan is not ack_scan else []
        pending += sum(1 for i in ids if i not in acked)
        print(f"{scan.path.name}: {scan.size} bytes, {len(scan.frames)} intact records, "
              f"{len(scan.damage)} damaged ranges")
        for d in scan.damage:
            print(f"  damaged bytes {d.start}-{d.end}: {d.reason}")
    damaged = sum(len(s.damage) for s in scans) + (len(ack_scan.damage) if ack_scan else 0)
    print(f"{directory}: {len(scans)} segments, {pending} unacknowledged records, {damaged} damaged ranges"
          + ("; run `t1 spool repair` to keep the intact records and set the damage aside" if damaged else ""))
    return EXIT_DAMAGED if damaged else 0


def _repair(args: argparse.Namespace) -> int:
    from t1.coordinator.spool.trajectory_spool import Spool

    directory = spool_dir(args.run_dir)
    if not directory.is_dir():
        print(f"error: {directory} is not a directory", file=sys.stderr)
        return EXIT_BAD_STATE
    try:
        with DirLock(directory.parent if directory.name == "spool" else directory, "t1 spool repair"):
            spool = Spool.open(directory, max_bytes=1 << 62, segment_bytes=1 << 30, fsync=True)
            print(f"{directory}: {spool.pending_count} unacknowledged records kept ({spool.pending_bytes} bytes)")
            spool.close()
    except DirectoryBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_STATE
    return 0
