"""Find and load tasks: one folder (either format), a dataset (folder of task folders), a named set from config."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from t1.config.tasks import TasksConfig
from t1.tasks.formats.load_harbor import load_harbor
from t1.tasks.formats.load_tb1 import load_tb1
from t1.tasks.spec import TaskParseError, TaskSpec


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file() or (path / "task.yaml").is_file()


def load_task(path: str | Path) -> TaskSpec:
    """Load one task folder, Harbor (task.toml) or Terminal-Bench 1 (task.yaml)."""
    root = Path(path)
    if (root / "task.toml").is_file():
        return load_harbor(root)
    if (root / "task.yaml").is_file():
        return load_tb1(root)
    if not root.is_dir():
        raise TaskParseError(root, "<folder>", "no such folder")
    raise TaskParseError(root, "<folder>", "not a task folder (no task.toml or task.yaml)")


def task_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Each path that is a task folder, plus the task folders directly inside each dataset folder, sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if is_task_dir(p):
            found.append(p)
        elif p.is_dir():
            inner = sorted(c for c in p.iterdir() if c.is_dir() and is_task_dir(c))
            if not inner:
                raise TaskParseError(p, "<folder>", "neither a task folder nor a folder of task folders")
            found.extend(inner)
        else:
            raise TaskParseError(p, "<folder>", "no such folder")
    return found


def load_dataset(paths: Iterable[str | Path], limit: int | None = None) -> list[TaskSpec]:
    """Load every task under the given task or dataset folders."""
    dirs = task_dirs(paths)
    return [load_task(d) for d in (dirs[:limit] if limit else dirs)]


def load_named_set(cfg: TasksConfig, name: str) -> list[TaskSpec]:
    """Load a task set registered in `tasks.sets`, synthesizing it first if configured and missing."""
    if name not in cfg.sets:
        known = ", ".join(sorted(cfg.sets)) or "none"
        raise KeyError(f"task set {name!r} is not in tasks.sets (known: {known})")
    s = cfg.sets[name]
    if not s.path.exists() and s.synth:
        from t1.tasks.synth import synthesize
        from t1.tasks.synth.curriculum import CURRICULUM, synthesize_curriculum
        from t1.tasks.synth.long_tier import LONG_TIER

        split = "eval" if s.split == "eval" else "train"
        if s.synth_kind in ("curriculum", "long"):
            families = LONG_TIER if s.synth_kind == "long" else CURRICULUM
            if s.synth_families is not None:
                unknown = sorted(set(s.synth_families) - set(families))
                if unknown:
                    raise ValueError(f"tasks.sets.{name}.synth_families names {unknown}, not families of synth_kind "
                                     f"{s.synth_kind!r} (known: {', '.join(sorted(families))})")
                families = {family: families[family] for family in s.synth_families}
            synthesize_curriculum(s.path, n=s.synth, seed=s.synth_seed, split=split, shortcuts=s.synth_shortcuts,
                                  shortcut_copies=s.synth_shortcut_copies, families=families)
        else:
            synthesize(s.path, n=s.synth, seed=s.synth_seed, split=split)
    return load_dataset([s.path], limit=s.limit)
