"""Issue 19 case 6: manual checkpoints are pruned by policy (the newest keep_manual stay), step tags as before."""

from __future__ import annotations

import os
from pathlib import Path

from t1.trainer.checkpoint import Checkpointer


class Engine:
    """DeepSpeed's save_checkpoint contract: writes <save_dir>/<tag>/ and a `latest` file naming it."""

    def save_checkpoint(self, save_dir: str, tag: str) -> None:
        d = Path(save_dir) / tag
        d.mkdir(parents=True, exist_ok=True)
        (d / "mp_rank_00_model_states.pt").write_bytes(b"x" * 64)
        (Path(save_dir) / "latest").write_text(tag)


def _tags(root: Path, sub: str) -> list[str]:
    return sorted(p.name for p in (root / sub).iterdir() if p.is_dir())


def test_manual_tags_beyond_the_bound_are_removed(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, keep=2, keep_manual=2)
    written: list[str] = []
    for tag in ["step1", "a", "b", "step2", "c", "d", "c", "e"]:
        ck.save(tag, Engine(), Engine())
        if (tmp_path / "rng" / f"{tag}.pt").exists():  # distinct write times, oldest first
            t = 1_000_000 + len(written)
            os.utime(tmp_path / "rng" / f"{tag}.pt", (t, t))
        written.append(tag)
        if tag == "d":
            assert _tags(tmp_path, "policy") == ["c", "d", "step1", "step2"]
            assert _tags(tmp_path, "critic") == ["c", "d", "step1", "step2"]
            assert sorted(p.stem for p in (tmp_path / "rng").glob("*.pt")) == ["c", "d", "step1", "step2"]
            ck.prune(["step1", "step2"])
            assert _tags(tmp_path, "policy") == ["c", "d", "step1", "step2"], "step pruning leaves manual tags"
    # Saving "c" again made it newer than "d".
    assert _tags(tmp_path, "policy") == ["c", "e", "step1", "step2"]
