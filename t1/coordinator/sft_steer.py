"""Steered SFT: the warm start trains on demonstrations until the validation solve rate stops rising.

With `trainer.warm_start.sft_eval_every` set, the trainer takes SFT steps only as far as the
coordinator allows (TrainerService.SteerSft). The coordinator allows `sft_eval_every` more steps,
waits until that version is on the inference servers, evaluates the validation set (training
tasks held out of the demonstrations) and repeats; SFT ends after `sft_patience` evals without a
new best solve rate, or at `sft_steps`. The curve (step, solve rate, attempts) goes into the report.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from t1.config.service import AuthConfig
from t1.config.trainer import WarmStartConfig
from t1.coordinator.run_state import TrainerSide
from t1.rpc.client import call_options, make_channel
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

EvalFn = Callable[[str], Awaitable[dict[str, Any]]]  # label -> the validation set's eval summary


@dataclass(frozen=True, slots=True)
class CurvePoint:
    step: int
    solve_rate: float
    attempts: int


def plateaued(rates: list[float], patience: int, min_gain: float = 0.0) -> bool:
    """True when the rate has risen above 0 and the last `patience` rates hold no new best (pure). A new best
    beats the best before it, by at least `min_gain` if that is set (a rise within the validation eval's
    noise is not a rise). A curve still at 0 has not begun to rise: SFT goes on (up to sft_steps)."""
    if len(rates) <= patience or max(rates) <= 0.0:
        return False
    best = 0
    for i, rate in enumerate(rates):
        gain = rate - rates[best]
        if gain > 0 and gain >= min_gain - 1e-9:
            best = i
    return best < len(rates) - patience


class SftSteer:
    """The SteerSft client of one trainer."""

    def __init__(self, target: str, auth: AuthConfig | None = None) -> None:
        self._auth = auth or AuthConfig()
        self._channel = make_channel(target, self._auth)
        self._stub = pb_grpc.TrainerServiceStub(self._channel)

    async def steer(self, allow_steps: int = 0, end: bool = False) -> pb.TrainerStatus:
        opts = call_options(self._auth, 600.0)  # ending SFT commits a checkpoint first
        return await self._stub.SteerSft(pb.SteerSftRequest(allow_steps=allow_steps, end=end), **opts.kw())

    async def close(self) -> None:
        await self._channel.close()


async def steered_sft(trainer: TrainerSide, steer: SftSteer, ws: WarmStartConfig, evaluate: EvalFn) -> list[CurvePoint]:
    """Run SFT in rounds of `ws.sft_eval_every` steps, a validation eval after each, until the plateau."""
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
        attempts = int(summary.get("attempts", summary.get("num_tasks", 0) * ws.sft_eval_attempts))
        curve.append(CurvePoint(taken, float(summary["resolve_rate"]), attempts))
        log.info("SFT step %d: validation solve rate %.3f", taken, summary["resolve_rate"])
        if taken >= ws.sft_steps or plateaued([p.solve_rate for p in curve], ws.sft_patience, ws.sft_min_gain):
            break
    await steer.steer(allow_steps=taken, end=True)
    log.info("SFT ended after %d steps (validation solve rates %s)", taken,
             ", ".join(f"{p.solve_rate:.2f}" for p in curve))
    return curve


def _at_least(version: int) -> Callable[[int], bool]:
    return lambda v: v >= version


def curve_records(curve: list[CurvePoint]) -> list[dict[str, Any]]:
    return [asdict(p) for p in curve]
