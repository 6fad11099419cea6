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
    synth_kind: Literal["ood", "curriculum", "long"] = Field(
        "ood", description="What to synthesize: the ten OOD families, the learnable multi-turn curriculum, or its "
        "long tier (12-40 commands, a value an early step shows needed late).")
    synth_shortcuts: float = Field(
        0.0, ge=0, le=1, description="Curriculum only: the share of tasks whose typed demonstration (turns.txt) "
        "is the family's shortcut, right only when hidden state allows it (a teacher of mixed quality).")
    synth_shortcut_copies: int = Field(
        0, ge=0, description="Curriculum only: every task with a shortcut is typed robustly once and with its "
        "shortcut this many times more (a teacher who shows each task both ways); excludes synth_shortcuts.")
    synth_families: list[str] | None = Field(
        None, min_length=1, description="Curriculum or long tier only: synthesize these of its families "
        "(round-robin, in name order); null: all of them.")
    limit: int | None = Field(None, ge=1, description="Use at most this many tasks.")

    @model_validator(mode="after")
    def _shortcuts_need_curriculum(self) -> TaskSetConfig:
        for name in ("synth_shortcuts", "synth_shortcut_copies"):
            if getattr(self, name) and self.synth_kind == "ood":
                raise ValueError(f"{name} is {getattr(self, name)} but synth_kind is {self.synth_kind!r}: "
                                 "only the curriculum's families have shortcuts")
        if self.synth_families is not None and self.synth_kind == "ood":
            raise ValueError(f"synth_families is {self.synth_families} but synth_kind is 'ood': only the "
                             "curriculum and its long tier are chosen by family")
        if self.synth_shortcuts and self.synth_shortcut_copies:
            raise ValueError(f"synth_shortcuts ({self.synth_shortcuts}) and synth_shortcut_copies "
                             f"({self.synth_shortcut_copies}) are two teachers: set one of them")
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
    process_every_k_turns: int | None = Field(None, ge=1, description="Run verifiers every K turns; null disables "
                                                                      "process rewards.")
    shared_baseline: bool = Field(
        True, description="A group's attempts share one verifier run before their first turns (the process "
        "rewards' baseline); false measures it per attempt (tasks whose set-up is not deterministic)."
    )
    bad_reply_penalty: float = Field(
        0.0, ge=0, description="Taken off an episode's reward for each reply with no valid action (with process "
        "rewards, off that turn's own reward). Without it a malformed reply costs nothing once the work is done "
        "(the verifiers run either way), and PPO lets the replies no reward depends on, like the finish call, drift.")
    infra_error_policy: Literal["drop_group", "drop_attempt"] = Field(
        "drop_attempt", description="A group with an infra error: drop it, or normalise without the failed attempt."
    )
