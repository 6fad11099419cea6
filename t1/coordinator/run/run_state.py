"""What the run is doing now: its phase, the eval job of an eval phase, the trainer side once connected.

One `RunState` per coordinator. Only the driver (app.py's Coordinator) writes it; run status,
the progress view and the status ticker read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from t1.coordinator.trainer_side.status import TrainerStatusPoller
    from t1.coordinator.trainer_side.trainer_link import TrainerLink
    from t1.coordinator.trainer_side.weights import WeightSync


class RunPhase(StrEnum):
    STARTING = "starting"
    SERVING = "serving"                      # eval jobs only (coordinator.train: false)
    WARM_START_DEMOS = "warm-start-demos"
    STARTING_SERVICES = "starting-services"
    EVAL_BEFORE = "eval-before"
    STARTING_TRAINER = "starting-trainer"
    SFT = "sft"                              # SFT steps and, when steered, validation evals
    EVAL_WARM_START = "eval-warm-start"
    TRAINING = "training"
    TRAINED = "trained"
    EVAL_AFTER = "eval-after"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class TrainerSide:
    """The parts that talk to the trainer, made together once its address is known."""

    link: TrainerLink
    weights: WeightSync
    poller: TrainerStatusPoller


@dataclass(frozen=True, slots=True)
class EvalJobRef:
    """The eval job an eval phase is waiting for (the progress view shows it)."""

    label: str
    job_id: str


@dataclass(slots=True)
class RunState:
    phase: RunPhase = RunPhase.STARTING
    eval_job: EvalJobRef | None = None
    trainer: TrainerSide | None = None
    sft_steps_taken: int | None = None  # once SFT has ended (steered SFT may end before its cap)
