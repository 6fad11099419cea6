"""Steered SFT: the warm start trains on demonstrations until the validation solve rate stops rising.

With `trainer.warm_start.sft_eval_every` set, the trainer takes SFT steps only as far as the
coordinator allows (TrainerService.SteerSft). The coordinator allows `sft_eval_every` more steps,
waits until that version is on the inference servers, evaluates the validation set (training
tasks held out of the demonstrations) and repeats; SFT ends after `sft_patience` evals without a
new best solve rate, or at `sft_steps`. The warm start is the weights of the latest round whose validation
rate is within `sft_min_gain` of the highest, not necessarily the last round's (later rounds can over-fit the
demonstrations): the trainer restores them from their published folder and publishes them as a new version.
With `sft_pool_rounds` k > 1, both rules judge a round by its rate pooled with the k - 1 rounds before it
(`pooled`): one 40-attempt eval's noise (about 0.08) is as large as the rise of several rounds, and adjacent
rounds' weights differ little. The curve (step, solve rate, attempts) and the step kept go into the report.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from t1.config.shared import AuthConfig
from t1.config.trainer import WarmStartConfig
from t1.coordinator.run.run_state import TrainerSide
from t1.evals.stats import EvalSummary
from t1.rpc.client import call_options, make_channel
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

EvalFn = Callable[[str], Awaitable[EvalSummary]]  # label -> the validation set's eval summary


@dataclass(frozen=True, slots=True)
class CurvePoint:
    step: int
    solve_rate: float
    attempts: int


def pooled(rates: list[float], rounds: int) -> list[float]:
    """Each round's rate pooled with the `rounds` - 1 before it (pure; every round has the same attempts)."""
    windows = (rates[max(0, i - rounds + 1):i + 1] for i in range(len(rates)))
    return [sum(w) / len(w) for w in windows]


def best_round(rates: list[float], min_gain: float = 0.0) -> int:
    """The index of the last new best (pure): a new best beats the best before it, by at least `min_gain` if
    that is set (a rise within the validation eval's noise is not a rise). The plateau rule counts from it."""
    best = 0
    for i, rate in enumerate(rates):
        gain = rate - rates[best]
        if gain > 0 and gain >= min_gain - 1e-9:
            best = i
    return best


def kept_round(rates: list[float], min_gain: float = 0.0) -> int:
    """The round whose weights become the warm start (pure): the latest whose rate is within `min_gain` of the
    highest. A rise smaller than `min_gain` is not a rise and a fall smaller than it is not a fall: among rounds
    the eval cannot tell apart, the one trained longest is kept. It is never before `best_round`, so at the
    plateau it is one of the last `sft_patience` + 1 rounds, whose folders are still published."""
    top = max(rates)
    return max(i for i, rate in enumerate(rates) if rate == top or rate > top - min_gain + 1e-9)


def plateaued(rates: list[float], patience: int, min_gain: float = 0.0) -> bool:
    """True when the rate has risen above 0 and the last `patience` rates hold no new best (pure). A curve
    still at 0 has not begun to rise: SFT goes on (up to sft_steps)."""
    if len(rates) <= patience or max(rates) <= 0.0:
        return False
    return best_round(rates, min_gain) < len(rates) - patience


@dataclass(frozen=True, slots=True)
class SftOutcome:
    curve: list[CurvePoint]
    kept_step: int  # the SFT step whose weights are the warm start

    @property
    def steps(self) -> int:
        """The SFT steps taken: the last round's."""
        return self.curve[-1].step


class SftSteer:
    """The SteerSft client of one trainer."""

    def __init__(self, target: str, auth: AuthConfig | None = None) -> None:
        self._auth = auth or AuthConfig()
        self._channel = make_channel(target, self._auth)
        self._stub = pb_grpc.TrainerServiceStub(self._channel)

    async def steer(self, allow_steps: int = 0, end: bool = False, keep_step: int = 0) -> pb.TrainerStatus:
        opts = call_options(self._auth, 600.0)  # ending SFT commits a checkpoint first
        req = pb.SteerSftRequest(allow_steps=allow_steps, end=end, keep_step=keep_step)
        return await self._stub.SteerSft(req, **opts.kw())

    async def close(self) -> None:
        await self._channel.close()


async def steered_sft(trainer: TrainerSide, steer: SftSteer, ws: WarmStartConfig, evaluate: EvalFn) -> SftOutcome:
    """Run SFT in rounds of `ws.sft_eval_every` steps, a validation eval after each, until the plateau; the
    best round's weights are the warm start, on the inference servers when this returns."""
    assert ws.sft_eval_every is not None
    status = await steer.steer()
    taken, version0 = int(status.step), int(status.policy_version)  # SFT is the first stage: steps == SFT steps
    curve: list[CurvePoint] = []
    while True:
        allow = min(taken + ws.sft_eval_every, ws.sft_steps)
        await steer.steer(allow_steps=allow)
        target = version0 + (allow - int(status.step))
        await trainer.weights.wait_for_version(_at_least(target))
        taken = allow
        summary = await evaluate(f"sft-{taken}")
        curve.append(CurvePoint(taken, summary.job.resolve_rate, summary.overall.attempts))
        log.info("SFT step %d: validation solve rate %.3f", taken, summary.job.resolve_rate)
        rates = pooled([p.solve_rate for p in curve], ws.sft_pool_rounds)
        if taken >= ws.sft_steps or plateaued(rates, ws.sft_patience, ws.sft_min_gain):
            break
    kept = curve[kept_round(rates, ws.sft_min_gain)].step if max(rates) > 0 else taken
    status = await steer.steer(allow_steps=taken, end=True, keep_step=kept)
    await trainer.weights.wait_for_version(_at_least(int(status.policy_version)))
    log.info("SFT ended after %d steps (validation solve rates %s, pooled %s); the warm start is step %d's weights",
             taken, ", ".join(f"{p.solve_rate:.2f}" for p in curve), ", ".join(f"{r:.2f}" for r in rates), kept)
    return SftOutcome(curve, kept)


def _at_least(version: int) -> Callable[[int], bool]:
    return lambda v: v >= version


def curve_records(curve: Sequence[CurvePoint]) -> list[dict[str, Any]]:
    return [asdict(p) for p in curve]
