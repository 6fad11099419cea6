"""Config of task sets, verifiers, rewards and decontamination."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from t1.config.base import Section


class TaskSetConfig(Section):
    """A named task set: a folder of task folders, optionally synthesized."""

    path: Path = Field(..., description="Folder of task folders (Terminal-Bench 1 or Harbor).")
    split: Literal["train", "eval", "any"] = Field("any", description="Which split this set is.")
    synth: int | None = Field(None, ge=1, description="If set and the folder is missing, synthesize this many tasks.")
    synth_seed: int = Field(0, description="Seed for synthesis.")
    synth_kind: Literal["ood", "curriculum"] = Field(
        "ood", description="What to synthesize: the ten OOD families, or the learnable multi-turn curriculum.")
    synth_shortcuts: float = Field(
        0.0, ge=0, le=1, description="Curriculum only: the share of tasks whose typed demonstration (turns.txt) "
        "is the family's shortcut, right only when hidden state allows it (a teacher of mixed quality).")
    limit: int | None = Field(None, ge=1, description="Use at most this many tasks.")

    @model_validator(mode="after")
    def _shortcuts_need_curriculum(self) -> TaskSetConfig:
        if self.synth_shortcuts and self.synth_kind != "curriculum":
            raise ValueError(f"synth_shortcuts is {self.synth_shortcuts} but synth_kind is {self.synth_kind!r}: "
                             "only the curriculum's families have shortcuts")
        return self


class DecontamConfig(Section):
    """Thresholds for decontamination against benchmarks."""

    ngram: int = Field(8, ge=2, description="Word n-gram length.")
    ngram_overlap: float = Field(0.5, ge=0, le=1, description="Share of shared n-grams that flags a pair.")
    minhash_threshold: float = Field(0.7, ge=0, le=1, description="Estimated Jaccard that flags a pair.")
    num_perm: int = Field(128, ge=16, description="MinHash permutations.")
    max_doc_freq: float = Field(
        0.05, gt=0, le=1, description="N-grams in more than this share of train tasks (and > 2) count as boilerplate."
    )


class TasksConfig(Section):
    """Task sets by name and the training/eval choice among them."""

    sets: dict[str, TaskSetConfig] = Field(default_factory=dict, description="Registry of named task sets.")
    train: list[str] = Field(default_factory=list, description="Names of the sets used for training.")
    eval: list[str] = Field(default_factory=list, description="Names of the sets used for the final eval.")
    decontam: DecontamConfig = Field(default_factory=DecontamConfig, description="Decontamination thresholds.")


class RewardConfig(Section):
    """How verifier results become rewards."""

    mode: Literal["count", "fraction", "binary"] = Field("count", description="Episode reward from verifiers.")
    process_every_k_turns: int | None = Field(None, ge=1, description="Run verifiers every K turns; null disables process rewards.")
    shared_baseline: bool = Field(
        True, description="A group's attempts share one verifier run before their first turns (the process "
        "rewards' baseline); false measures it per attempt (tasks whose set-up is not deterministic)."
    )
    infra_error_policy: Literal["drop_group", "drop_attempt"] = Field(
        "drop_attempt", description="A group with an infra error: drop it, or normalise without the failed attempt."
    )
