"""Episode rows of the viewer's index and the episodes table's query: filter, sort, page (pure functions).

A row is what the table shows and filters on, summarised once from the trajectory record (or an
eval attempt's row) when the index first sees it; the record itself is read again only when its
episode's page is opened.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from t1.evals.stats import task_family
from t1.trajectory.types import EpisodeStatus, Trajectory
from t1.view.sources import Locator

PAGE_SIZE = 50


class Source(StrEnum):
    TRAIN = "train"  # a training rollout (spool or trainer buffer)
    DEMO = "demo"    # an oracle demonstration for the warm start
    EVAL = "eval"    # an eval job's attempt (summary row; no tokens are kept for evals)


@dataclass(frozen=True, slots=True)
class EpisodeRow:
    """One episode as the table shows it."""

    id: str
    task_id: str
    family: str
    split: str
    source: Source
    group_id: str
    attempt: int
    status: EpisodeStatus
    reward: float
    passed: int
    total: int
    num_turns: int
    num_tokens: int
    num_segments: int
    min_version: int
    max_version: int
    finished: float
    locator: Locator | None = None  # None: no trajectory record (eval attempts)
    subdir: str = "train"           # where its transcript is: transcripts/<subdir>/<task>/<id>[-<hex>].md
    trained_step: int | None = None

    @property
    def infra_error(self) -> bool:
        return self.status is EpisodeStatus.INFRA_ERROR

    @property
    def solved(self) -> bool:
        return self.total > 0 and self.passed == self.total


def summarize(t: Trajectory, source: Source, split: str, locator: Locator, finished: float) -> EpisodeRow:
    """The row of a trajectory record."""
    versions = [s.policy_versions[s.policy_versions >= 0] for s in t.segments]
    sampled = np.concatenate(versions) if versions else np.zeros(0, np.int32)
    return EpisodeRow(
        id=t.id, task_id=t.task_id, family=task_family(t.task_id), split=split, source=source, group_id=t.group_id,
        attempt=t.attempt, status=t.status, reward=t.reward, passed=t.verifier.passed, total=t.verifier.total,
        num_turns=sum(len(s.turns) for s in t.segments), num_tokens=t.num_tokens, num_segments=len(t.segments),
        min_version=int(sampled.min()) if sampled.size else -1, max_version=int(sampled.max()) if sampled.size else -1,
        finished=finished, locator=locator)


class SortKey(StrEnum):
    FINISHED = "finished"
    REWARD = "reward"
    TURNS = "turns"
    TOKENS = "tokens"
    TASK = "task"
    VERSION = "version"


_SORT = {
    SortKey.FINISHED: lambda r: r.finished,
    SortKey.REWARD: lambda r: r.reward,
    SortKey.TURNS: lambda r: r.num_turns,
    SortKey.TOKENS: lambda r: r.num_tokens,
    SortKey.TASK: lambda r: (r.task_id, r.attempt),
    SortKey.VERSION: lambda r: r.max_version,
}


@dataclass(frozen=True, slots=True)
class EpisodeQuery:
    """The table's filters (empty: any), sort and page; built from URL parameters by `from_params`."""

    task: str = ""
    family: str = ""
    split: str = ""
    status: str = ""
    source: str = ""
    infra: str = ""  # "yes" | "no" | ""
    min_reward: float | None = None
    max_reward: float | None = None
    version: int | None = None
    sort: SortKey = SortKey.FINISHED
    descending: bool = True
    page: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> EpisodeQuery:
        """Parse URL parameters; a bad value is a ValueError naming the parameter."""
        def num(key: str, kind: type) -> float | int | None:
            raw = params.get(key, "").strip()
            if not raw:
                return None
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"parameter {key}={raw!r} is not a {kind.__name__}") from None
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"parameter {key}={raw!r} is not a finite number")
            return value

        sort_raw = params.get("sort", SortKey.FINISHED)
        try:
            sort = SortKey(sort_raw)
        except ValueError:
            raise ValueError(f"parameter sort={sort_raw!r} is not one of {[k.value for k in SortKey]}") from None
        infra = params.get("infra", "")
        if infra not in ("", "yes", "no"):
            raise ValueError(f"parameter infra={infra!r} is not yes or no")
        page = num("page", int) or 1
        version = num("version", int)
        return cls(task=params.get("task", "").strip(), family=params.get("family", "").strip(),
                   split=params.get("split", "").strip(), status=params.get("status", "").strip(),
                   source=params.get("source", "").strip(), infra=infra,
                   min_reward=num("min_reward", float), max_reward=num("max_reward", float),
                   version=None if version is None else int(version), sort=sort,
                   descending=params.get("order", "desc") != "asc", page=max(1, int(page)))

    def matches(self, r: EpisodeRow) -> bool:
        return ((not self.task or self.task in r.task_id) and (not self.family or r.family == self.family)
                and (not self.split or r.split == self.split) and (not self.status or r.status == self.status)
                and (not self.source or r.source == self.source)
                and (not self.infra or r.infra_error == (self.infra == "yes"))
                and (self.min_reward is None or r.reward >= self.min_reward)
                and (self.max_reward is None or r.reward <= self.max_reward)
                and (self.version is None or r.min_version <= self.version <= r.max_version))

    @property
    def has_filters(self) -> bool:
        return any((self.task, self.family, self.split, self.status, self.source, self.infra,
                    self.min_reward is not None, self.max_reward is not None, self.version is not None))


@dataclass(frozen=True, slots=True)
class EpisodePage:
    rows: tuple[EpisodeRow, ...]
    total: int      # rows matching the filters
    page: int
    num_pages: int


def sort_rows(rows: Sequence[EpisodeRow], key: SortKey, descending: bool) -> list[EpisodeRow]:
    """Rows in the table's order: by `key`, ties by id (stable)."""
    out = sorted(rows, key=lambda r: r.id)
    out.sort(key=_SORT[key], reverse=descending)
    return out


def page_of(sorted_rows: Sequence[EpisodeRow], q: EpisodeQuery, page_size: int = PAGE_SIZE) -> EpisodePage:
    """Filter rows already in q's order and cut one page (a page past the end is the last page)."""
    hits = [r for r in sorted_rows if q.matches(r)] if q.has_filters else sorted_rows
    num_pages = max(1, -(-len(hits) // page_size))
    page = min(q.page, num_pages)
    start = (page - 1) * page_size
    return EpisodePage(tuple(hits[start:start + page_size]), len(hits), page, num_pages)


def run_query(rows: Sequence[EpisodeRow], q: EpisodeQuery, page_size: int = PAGE_SIZE) -> EpisodePage:
    """Sort, filter and cut one page."""
    return page_of(sort_rows(rows, q.sort, q.descending), q, page_size)


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """Group-relative advantage of each attempt: (reward - group mean) / group std (0 when all are equal)."""
    if not rewards:
        return []
    arr = np.asarray(rewards, np.float64)
    std = float(arr.std())
    return [0.0 if std == 0 else float(x) for x in (arr - arr.mean()) / (std or 1.0)]
