"""Checkpoints: DeepSpeed engine state (weights, optimizer, scheduler) of policy and critic, plus RNG.

Layout: checkpoints/{policy,critic}/<tag>/ (DeepSpeed's own format) and checkpoints/rng/<tag>.pt.
Which tag is current is recorded in the buffer's database in the same transaction as the steps it
covers, so a checkpoint directory that exists but was never recorded is simply ignored.

Disk use is bounded by policy: step tags beyond the newest `keep` recorded ones are removed at
every commit, and manual tags (SaveCheckpoint) beyond the newest `keep_manual` at every save.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from t1.trainer.engine import rank


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(self, root: Path, keep: int = 2, keep_manual: int = 3) -> None:
        self.root, self.keep, self.keep_manual = root, keep, keep_manual

    def save(self, tag: str, policy: Any, critic: Any | None) -> Path:
        """Collective under ZeRO: every rank calls it."""
        policy.save_checkpoint(str(self.root / "policy"), tag=tag)
        if critic is not None:
            critic.save_checkpoint(str(self.root / "critic"), tag=tag)
        if rank() == 0:
            (self.root / "rng").mkdir(parents=True, exist_ok=True)
            tmp = self.root / "rng" / f".{tag}.pt.tmp"
            torch.save(rng_state(), tmp)
            tmp.replace(self.root / "rng" / f"{tag}.pt")
            if not tag.startswith("step"):
                self.prune_manual()
        return self.root / "policy" / tag

    def load(self, tag: str, policy: Any, critic: Any | None) -> None:
        path, _ = policy.load_checkpoint(str(self.root / "policy"), tag=tag)
        if path is None:
            raise FileNotFoundError(f"policy checkpoint {tag!r} not found under {self.root / 'policy'}")
        if critic is not None:
            path, _ = critic.load_checkpoint(str(self.root / "critic"), tag=tag)
            if path is None:
                raise FileNotFoundError(f"critic checkpoint {tag!r} not found under {self.root / 'critic'}")
        rng_file = self.root / "rng" / f"{tag}.pt"
        if rng_file.exists():
            set_rng_state(torch.load(rng_file, weights_only=False))

    def prune(self, keep_tags: list[str]) -> None:
        """Remove step checkpoints other than the newest `keep` of keep_tags (manual tags stay)."""
        if rank() != 0:
            return
        keep = set(keep_tags[-self.keep:])
        for sub in ("policy", "critic"):
            base = self.root / sub
            if not base.is_dir():
                continue
            for d in base.iterdir():
                if d.is_dir() and d.name.startswith("step") and d.name not in keep:
                    shutil.rmtree(d, ignore_errors=True)
        rng = self.root / "rng"
        if rng.is_dir():
            for f in rng.glob("step*.pt"):
                if f.stem not in keep:
                    f.unlink(missing_ok=True)

    def manual_tags(self) -> list[str]:
        """Manual tags on disk, oldest first: by their RNG file, which every save replaces (else the folder)."""
        base = self.root / "policy"
        if not base.is_dir():
            return []

        def written(d: Path) -> float:
            rng = self.root / "rng" / f"{d.name}.pt"
            return (rng if rng.exists() else d).stat().st_mtime

        dirs = [d for d in base.iterdir() if d.is_dir() and not d.name.startswith("step")]
        return [d.name for d in sorted(dirs, key=lambda d: (written(d), d.name))]

    def prune_manual(self) -> list[str]:
        """Remove manual tags beyond the newest keep_manual; returns the removed tags."""
        tags = self.manual_tags()
        drop = tags[: max(len(tags) - self.keep_manual, 0)]
        for tag in drop:
            for sub in ("policy", "critic"):
                shutil.rmtree(self.root / sub / tag, ignore_errors=True)
            (self.root / "rng" / f"{tag}.pt").unlink(missing_ok=True)
        return drop
