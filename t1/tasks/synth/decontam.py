"""Decontamination: find training tasks that overlap benchmark tasks, by word n-grams and MinHash.

A task's text is its instruction, tests and solution together. For every
(train, benchmark) pair the exact word n-gram containment |A ∩ B| / min(|A|, |B|)
and the MinHash estimate of the Jaccard similarity are computed; a pair where
either reaches its threshold (tasks.decontam in config) is flagged, and the
containment of each part (instruction, tests, solution) is reported with it.
N-grams shared by many train tasks (family templates, test-harness boilerplate;
`max_doc_freq`) are ignored on both sides: they say a task follows a template,
not that it was copied. MinHash uses numpy: per permutation a random 64-bit key
XORed into each n-gram hash and scattered by splitmix64's finalizer (a
bijection), keeping the minimum.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from t1.config.tasks import DecontamConfig
from t1.tasks.spec import TaskSpec

FIELDS = ("instruction", "tests", "solution")
ALL_FIELDS = ("task", *FIELDS)  # "task": the three together
_WORD = re.compile(r"[a-z0-9_]+")
_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class DecontamHit:
    """One flagged (train task, benchmark task) pair: whole-task scores and the containment per field."""

    train: str
    against: str
    ngram_overlap: float
    minhash_jaccard: float
    field_overlap: tuple[tuple[str, float], ...] = ()


def _folder_text(path: Path | None) -> str:
    if path is None or not path.exists():
        return ""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    parts = []
    for f in files:
        if f.stat().st_size <= _MAX_FILE_BYTES:
            parts.append(f.read_bytes().decode("utf-8", errors="ignore"))
    return "\n".join(parts)


def task_texts(spec: TaskSpec) -> dict[str, str]:
    """The instruction, tests and solution text of a task (all steps together)."""
    instruction, tests, solution = [], [], []
    for phase in spec.phases():
        instruction.append(phase.instruction)
        tests.append(_folder_text(phase.verifier.tests_dir))
        if phase.verifier.run_tests_sh is not None:
            tests.append(_folder_text(phase.verifier.run_tests_sh))
        if phase.solution is not None:
            solution.append("\n".join(phase.solution.commands) or
                            _folder_text(phase.solution.files_dir or phase.solution.script))
    return {"instruction": "\n".join(instruction), "tests": "\n".join(tests), "solution": "\n".join(solution)}


def ngram_hashes(text: str, n: int) -> np.ndarray:
    """The distinct 64-bit hashes of the word n-grams of `text` (lower-cased words of [a-z0-9_])."""
    words = _WORD.findall(text.lower())
    if len(words) < n:
        grams = [" ".join(words)] if words else []
    else:
        grams = [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
    hashes = {int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "little") for g in grams}
    return np.fromiter(sorted(hashes), dtype=np.uint64, count=len(hashes))


def permutations(num_perm: int, seed: int = 1) -> np.ndarray:
    """One random 64-bit key per permutation."""
    return np.random.default_rng(seed).integers(0, np.iinfo(np.uint64).max, size=num_perm, dtype=np.uint64,
                                                endpoint=True)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of 64-bit integers that scatters nearby inputs (wrapping uint64 math)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def minhash(hashes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """MinHash signature [num_perm]: per key, the minimum of mix64(hash XOR key); all-max for an empty set."""
    if hashes.size == 0:
        return np.full(keys.shape, np.iinfo(np.uint64).max, dtype=np.uint64)
    return _mix64(hashes[:, None] ^ keys[None, :]).min(axis=0)


def containment(a: np.ndarray, b: np.ndarray) -> float:
    """|A ∩ B| / min(|A|, |B|) of two sorted hash arrays (0 when either is empty)."""
    if a.size == 0 or b.size == 0:
        return 0.0
    return float(np.intersect1d(a, b, assume_unique=True).size / min(a.size, b.size))


@dataclass(frozen=True, slots=True)
class _Doc:
    id: str
    hashes: dict[str, np.ndarray]


def _docs(specs: Iterable[TaskSpec], n: int) -> list[_Doc]:
    docs = []
    for spec in specs:
        texts = task_texts(spec)
        texts["task"] = "\n".join(texts[f] for f in FIELDS)
        docs.append(_Doc(spec.id, {f: ngram_hashes(texts[f], n) for f in ALL_FIELDS}))
    return docs


def boilerplate(docs: Sequence[_Doc], field: str, max_doc_freq: float) -> np.ndarray:
    """N-gram hashes found in more than max(2, max_doc_freq * len(docs)) documents: template text, not evidence."""
    if not docs:
        return np.zeros(0, dtype=np.uint64)
    values, counts = np.unique(np.concatenate([d.hashes[field] for d in docs]), return_counts=True)
    return values[counts > max(2.0, max_doc_freq * len(docs))]


def find_overlaps(train: Sequence[TaskSpec], against: Sequence[TaskSpec], cfg: DecontamConfig) -> list[DecontamHit]:
    """Every (train, against) pair whose whole-task overlap reaches a threshold.

    N-grams that are boilerplate of the train corpus (see `boilerplate`) are dropped from both sides first,
    so tasks that merely share a family template with a benchmark task are not flagged for it.
    """
    train_docs, against_docs = _docs(train, cfg.ngram), _docs(against, cfg.ngram)
    if not train_docs or not against_docs:
        return []
    common = {f: boilerplate(train_docs, f, cfg.max_doc_freq) for f in ALL_FIELDS}

    def strip(doc: _Doc, field: str) -> np.ndarray:
        return np.setdiff1d(doc.hashes[field], common[field], assume_unique=True)

    keys = permutations(cfg.num_perm)
    t_sets = [strip(d, "task") for d in train_docs]
    a_sets = [strip(d, "task") for d in against_docs]
    sig_t = np.stack([minhash(h, keys) for h in t_sets])
    sig_a = np.stack([minhash(h, keys) for h in a_sets])
    hits = []
    for j, ad in enumerate(against_docs):
        jaccard = (sig_t == sig_a[j][None, :]).mean(axis=1)
        for i, td in enumerate(train_docs):
            overlap = containment(t_sets[i], a_sets[j])
            if overlap < cfg.ngram_overlap and jaccard[i] < cfg.minhash_threshold:
                continue
            fields = tuple((f, round(containment(strip(td, f), strip(ad, f)), 4)) for f in FIELDS)
            hits.append(DecontamHit(td.id, ad.id, round(overlap, 4), round(float(jaccard[i]), 4), fields))
    return sorted(hits, key=lambda h: (h.train, h.against))


def write_clean_copy(train: Sequence[TaskSpec], hits: Sequence[DecontamHit], out: Path) -> list[str]:
    """Copy every train task that was not flagged into `out`; returns the ids copied."""
    flagged = {h.train for h in hits}
    out.mkdir(parents=True, exist_ok=True)
    kept = []
    for spec in train:
        if spec.id in flagged:
            continue
        shutil.copytree(spec.root, out / spec.root.name, dirs_exist_ok=True)
        kept.append(spec.id)
    return kept


def write_exclusions(hits: Sequence[DecontamHit], path: Path) -> None:
    """One flagged train task id per line, sorted."""
    path.write_text("".join(f"{t}\n" for t in sorted({h.train for h in hits})), encoding="utf-8")
