"""Weight publishing: the policy as a Hugging Face folder weights/v{N}, written atomically, last K kept.

A version folder is written under a temporary name, fsynced, then renamed, so a reader sees either
no folder or a complete one. t1_version.json inside it says which version and step it is.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from t1.trainer.models import copy_side_files

log = logging.getLogger(__name__)
VERSION_FILE = "t1_version.json"
_VERSION_DIR = re.compile(r"^v(\d+)$")


@dataclass(frozen=True, slots=True)
class PublishedVersion:
    version: int
    path: Path
    step: int
    published_unix: float


def _fsync_tree(root: Path) -> None:
    for f in root.iterdir():
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Publisher:
    """Writes and lists weights/v{N} folders."""

    def __init__(self, weights_dir: Path, source_model: Path, keep: int) -> None:
        self.dir, self.source, self.keep = weights_dir, source_model, keep
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)

    def publish(self, model: Any, state_dict: dict[str, torch.Tensor], version: int, step: int) -> PublishedVersion:
        final = self.dir / f"v{version}"
        tmp = self.dir / f".tmp-v{version}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp), state_dict=state_dict, safe_serialization=True)
        copy_side_files(self.source, tmp)
        now = time.time()
        (tmp / VERSION_FILE).write_text(json.dumps({"version": version, "step": step, "published_unix": now}) + "\n")
        _fsync_tree(tmp)
        if final.exists():  # a step redone after a crash publishes its version again
            shutil.rmtree(final)
        os.replace(tmp, final)
        self.prune()
        log.info("published policy version %d (step %d) at %s", version, step, final)
        return PublishedVersion(version, final, step, now)

    def published(self) -> list[PublishedVersion]:
        """Complete version folders, oldest first."""
        found = []
        for d in self.dir.iterdir():
            m = _VERSION_DIR.match(d.name)
            if not m or not (d / VERSION_FILE).is_file():
                continue
            meta = json.loads((d / VERSION_FILE).read_text())
            found.append(PublishedVersion(int(m.group(1)), d, int(meta["step"]), float(meta["published_unix"])))
        return sorted(found, key=lambda v: v.version)

    def prune(self) -> None:
        for old in self.published()[:-self.keep]:
            shutil.rmtree(old.path, ignore_errors=True)

    def drop_after(self, version: int) -> None:
        """Remove versions above `version` (published by steps a crash rolled back)."""
        for v in self.published():
            if v.version > version:
                log.warning("removing weights v%d: its step was not checkpointed before the restart", v.version)
                shutil.rmtree(v.path, ignore_errors=True)
