"""The synthesized OOD corpus: structure, determinism, split seeds, oracles in sandboxes, and decontamination."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from t1.config.tasks import DecontamConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.tasks.formats.dataset import load_dataset
from t1.tasks.synth import FAMILIES, corpus_texts, plan, synthesize, task_seed
from t1.tasks.synth.decontam import (
    find_overlaps,
    minhash,
    ngram_hashes,
    permutations,
    write_clean_copy,
    write_exclusions,
)
from t1.tasks.verify.oracle import RunMode, RunStatus, run_tasks


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "corpus"
    synthesize(root, n=200, seed=0, split="train")
    return root


def test_corpus_shape(corpus: Path) -> None:
    specs = load_dataset([corpus])
    assert len(specs) == 200 and len({s.id for s in specs}) == 200
    assert {s.metadata.family for s in specs} == set(FAMILIES)
    assert {s.metadata.difficulty for s in specs} == {"easy", "medium", "hard"}
    for s in specs:
        assert s.environment.allow_internet is False and s.environment.dockerfile is not None
        assert s.metadata.split == "train" and s.metadata.source == "t1-synth"
        assert all(p.solution is not None for p in s.phases())
        tests = sum(p.verifier.tests_dir.joinpath("test_outputs.py").read_text().count("\ndef test_")
                    for p in s.phases())
        assert tests >= 3, s.id  # several independent verifiers: a dense count reward
    multi = [s for s in specs if s.is_multi_step]
    assert multi and all(len(s.steps) >= 4 and s.metadata.family == "long_horizon" for s in multi)


def test_deterministic_and_disjoint_splits(tmp_path: Path) -> None:
    a, b = synthesize(tmp_path / "a", 12, seed=3), synthesize(tmp_path / "b", 12, seed=3)
    for pa, pb in zip(a, b, strict=True):
        files_a = sorted(p.relative_to(pa) for p in pa.rglob("*") if p.is_file())
        assert files_a == sorted(p.relative_to(pb) for p in pb.rglob("*") if p.is_file())
        assert all((pa / f).read_bytes() == (pb / f).read_bytes() for f in files_a)
    train = {s for seed in range(5) for _, s in plan(300, seed, "train")}
    evals = {s for seed in range(5) for _, s in plan(300, seed, "eval")}
    assert len(train) == 1500 and len(evals) == 1500 and not train & evals
    assert task_seed(7, 3, "train") % 2 == 0 and task_seed(7, 3, "eval") % 2 == 1
    with pytest.raises(ValueError, match="split"):
        task_seed(0, 0, "test")
    prefix = [f for f, _ in plan(len(FAMILIES), 11, "train")]
    assert sorted(prefix) == sorted(FAMILIES)  # any prefix of a plan is stratified over families


def test_corpus_texts() -> None:
    texts = list(corpus_texts(n=20, seed=0))
    assert len(texts) >= 40 and all(isinstance(t, str) and t.strip() for t in texts)
    assert any("git" in t for t in texts) and any("sqlite" in t.lower() for t in texts)


def test_minhash_estimates_jaccard() -> None:
    keys = permutations(256, seed=0)
    a = ngram_hashes(" ".join(f"w{i}" for i in range(400)), 3)
    b = ngram_hashes(" ".join(f"w{i}" for i in range(200, 600)), 3)
    true_j = np.intersect1d(a, b).size / np.union1d(a, b).size
    est = float((minhash(a, keys) == minhash(b, keys)).mean())
    assert abs(est - true_j) < 0.08 and (minhash(a, keys) == minhash(a, keys)).all()


def test_decontam_finds_exactly_the_copies(corpus: Path, tmp_path: Path) -> None:
    train = load_dataset([corpus])
    copies = [train[i] for i in (0, 17, 55, 101, 160)]  # several families, one multi-step among them
    bench = tmp_path / "bench"
    for s in copies:
        shutil.copytree(s.root, bench / f"bench-{s.root.name}")
    edited = Path(shutil.copytree(train[3].root, bench / "edited"))  # a lightly edited copy is still found
    text = (edited / "instruction.md").read_text()
    (edited / "instruction.md").write_text("Please do the following carefully.\n" + text.replace("/app", "/srv"))
    hits = find_overlaps(train, load_dataset([bench]), DecontamConfig())
    assert sorted(h.train for h in hits) == sorted(s.id for s in [*copies, train[3]])
    exact = [h for h in hits if h.train != train[3].id]
    assert all(h.ngram_overlap == 1.0 and h.minhash_jaccard == 1.0 for h in exact)
    near = next(h for h in hits if h.train == train[3].id)
    assert 0.5 <= near.ngram_overlap < 1.0 and dict(near.field_overlap)["tests"] == 1.0
    kept = write_clean_copy(train, exact, tmp_path / "clean")
    assert len(kept) == 195 and not {s.id for s in copies} & set(kept)
    assert len(load_dataset([tmp_path / "clean"])) == 195
    write_exclusions(hits, tmp_path / "excluded.txt")
    assert (tmp_path / "excluded.txt").read_text().split() == sorted(h.train for h in hits)


def _one_per_family(corpus: Path) -> list:
    seen, picked = set(), []
    for s in load_dataset([corpus]):
        if s.metadata.family not in seen:
            seen.add(s.metadata.family)
            picked.append(s)
    return picked


async def _check_oracle_and_noop(provider: LocalProvider, specs: list) -> None:
    oracle = await run_tasks(provider, specs, RunMode.ORACLE, concurrency=2)
    noop = await run_tasks(provider, specs, RunMode.VERIFY, concurrency=2)
    for o, n in zip(oracle, noop, strict=True):
        assert o.status is RunStatus.OK and o.resolved and o.reward == o.report.total, o.as_json()
        assert not n.resolved and n.reward < o.reward, n.as_json()


async def test_stratified_sample_oracles_and_noop(provider: LocalProvider, corpus: Path) -> None:
    sample = _one_per_family(corpus)
    assert len(sample) == len(FAMILIES)
    await _check_oracle_and_noop(provider, sample)


FULL_CORPUS_SHARDS = 20  # 4-7 s of oracle + untouched verify per task on 2 cores: 10 per shard leave 5x margin


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(FULL_CORPUS_SHARDS))
async def test_full_corpus_oracles_and_noop(provider: LocalProvider, corpus: Path, shard: int) -> None:
    """All 200 synthesized tasks, in 20 shards of 10 (each shard is one test, with its own time budget)."""
    specs = load_dataset([corpus])
    assert len(specs) == 200
    await _check_oracle_and_noop(provider, specs[shard::FULL_CORPUS_SHARDS])
