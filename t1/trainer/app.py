"""The t1-trainer process: builds the core, serves TrainerService, and runs the training loop.

  PushTrajectories -> buffer (SQLite, fsync) --wake--> train loop (rank 0, asyncio)
                                                         | order: step | checkpoint | end_sft | stop
                                                         v  (broadcast to every rank)
                                       worker thread: TrainerCore.step / save / commit
                                                         |
                           weights/v{N} <- publish <-----+----> VersionBoard -> WatchVersions

Ranks other than 0 run only `follow` (no server): they execute the orders rank 0 broadcasts.
Shutdown (SIGTERM/SIGINT): the loop finishes the step in flight, commits it with a checkpoint,
tells the other ranks to stop, the gRPC server stops with its grace period, and the process group
is destroyed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from t1.config.schema import T1Config
from t1.rpc.loop import wait_or_stop
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.trainer import engine as ds
from t1.trainer.core import Stage, StepOutcome, TrainerCore
from t1.trainer.service import LoopRequest, SteerSftRequest, TrainerServicer, VersionBoard
from t1.v1 import trainer_pb2_grpc

log = logging.getLogger(__name__)
ENDPOINT_FILE = "endpoint.json"
IDLE_POLL_S = 1.0
# Ranks > 0 wait for orders inside a collective; an idle rank 0 sends a no-op this often so that
# wait never reaches the process group's timeout.
HEARTBEAT_S = 60.0


class OrderKind(StrEnum):
    """What an order tells every rank to do."""

    STEP = "step"              # a training step on rank 0's groups
    CHECKPOINT = "checkpoint"  # a manual checkpoint under the order's tag
    NOOP = "noop"              # the idle heartbeat: keeps the waiting collective inside its timeout
    END_SFT = "end_sft"        # steered SFT ends here (SteerSft end)
    STOP = "stop"              # commit what is pending and end


@dataclass(frozen=True, slots=True)
class Order:
    """What every rank does next: a training step (with rank 0's groups), a checkpoint, or stop."""

    kind: OrderKind
    groups: list[tuple[str, list[tuple[str, bytes]]]] | None = None
    tag: str = ""
    keep_step: int = 0  # END_SFT: the SFT step whose weights the warm start keeps (0: the steps taken)


def execute(core: TrainerCore, order: Order | None) -> tuple[Order, Any]:
    """Broadcast rank 0's order and run it here; returns the order and its result."""
    order = ds.broadcast_object(order)
    assert order is not None
    if order.kind == OrderKind.STEP:
        return order, core.step(order.groups)
    if order.kind == OrderKind.CHECKPOINT:
        return order, core.save_manual(order.tag)
    if order.kind == OrderKind.NOOP:
        return order, None
    if order.kind == OrderKind.END_SFT:
        return order, core.end_sft(order.keep_step)
    core.commit_pending()
    return order, None


def follow(core: TrainerCore) -> None:
    """Ranks > 0: run rank 0's orders until it says stop."""
    while True:
        order, _ = execute(core, None)
        if order.kind == OrderKind.STOP:
            return


async def train_loop(core: TrainerCore, board: VersionBoard, wake: asyncio.Event,
                     requests: asyncio.Queue[LoopRequest], stop: asyncio.Event) -> None:
    last_order = time.monotonic()
    while not stop.is_set():
        while not requests.empty():
            req = requests.get_nowait()
            if isinstance(req, SteerSftRequest):
                await _steer(core, board, req)
                continue
            try:
                _, path = await asyncio.to_thread(execute, core, Order(OrderKind.CHECKPOINT, tag=req.tag))
                req.done.set_result((path, core.state))
            except Exception as exc:  # the RPC caller gets the error; training goes on
                log.exception("checkpoint %s failed", req.tag)
                req.done.set_exception(exc)
        stage = core.stage()
        groups = None
        if stage in (Stage.CRITIC_WARMUP, Stage.PPO):
            groups = await asyncio.to_thread(core.take_groups)
        if stage == Stage.DONE or (stage != Stage.SFT and groups is None) or core.sft_waiting():
            if ds.world_size() > 1 and time.monotonic() - last_order > HEARTBEAT_S:
                await asyncio.to_thread(execute, core, Order(OrderKind.NOOP))
                last_order = time.monotonic()
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), IDLE_POLL_S)
            continue
        try:
            _, outcome = await asyncio.to_thread(execute, core, Order(OrderKind.STEP, groups=groups))
        except Exception as exc:
            if not groups:
                raise  # an SFT step on demonstrations: nothing to set aside
            await asyncio.to_thread(quarantine, core, groups, exc)
            continue
        last_order = time.monotonic()
        assert isinstance(outcome, StepOutcome)
        if outcome.published is not None:
            await board.announce(outcome.published)


async def _steer(core: TrainerCore, board: VersionBoard, req: SteerSftRequest) -> None:
    try:
        core.allow_sft(req.allow_steps)
        if req.end:
            _, published = await asyncio.to_thread(execute, core, Order(OrderKind.END_SFT, keep_step=req.keep_step))
            if published is not None:
                await board.announce(published)
        req.done.set_result(None)
    except Exception as exc:  # the RPC caller gets the error
        log.exception("SteerSft failed")
        req.done.set_exception(exc)


def quarantine(core: TrainerCore, groups: list[tuple[str, list[tuple[str, bytes]]]], exc: BaseException) -> None:
    """A step failed on these groups: set them aside with the reason, so the next step takes others.

    Accept-time checks refuse what is known to break a step; this is the net under them, so a
    record that still fails is a visible, counted quarantine instead of a crash loop."""
    assert core.buffer is not None
    reason = f"step {core.state.step + 1} failed: {type(exc).__name__}: {exc}"
    ids = [g for g, _ in groups]
    log.error("quarantined %d groups (%s): %s", len(ids), ", ".join(ids), reason, exc_info=exc)
    core.buffer.quarantine(ids, reason, core.state.step + 1)


def write_endpoint(work_dir: Path, address: str) -> None:
    tmp = work_dir / f".{ENDPOINT_FILE}.tmp"
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}) + "\n")
    tmp.replace(work_dir / ENDPOINT_FILE)


async def serve(cfg: T1Config) -> int:
    core = await asyncio.to_thread(TrainerCore, cfg)
    if ds.rank() != 0:
        for sig in (signal.SIGTERM, signal.SIGINT):  # rank 0 decides when to stop, and says so
            signal.signal(sig, signal.SIG_IGN)
        await asyncio.to_thread(follow, core)
        core.close()
        ds.shutdown_distributed()
        return 0
    assert core.buffer is not None
    board = VersionBoard(core.publisher.published())
    wake = asyncio.Event()
    checkpoints: asyncio.Queue[LoopRequest] = asyncio.Queue()
    servicer = TrainerServicer(core.buffer, core.group_size, board, wake, checkpoints,
                               core.reported_status, core.model_bounds)
    server = GrpcServer([ServiceBinding("t1.v1.TrainerService", trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
                                        servicer)], cfg.trainer.server, cfg.auth)
    await server.start()
    write_endpoint(core.work_dir, server.address)
    print(f"t1-trainer listening on {server.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    trainer = asyncio.create_task(train_loop(core, board, wake, checkpoints, stop))
    try:
        # A training error ends the process with it; on stop the loop finishes its step in flight.
        await wait_or_stop(trainer, stop)
        await trainer
    finally:
        log.info("trainer stopping at step %d, policy version %d", core.state.step, core.state.policy_version)
        await asyncio.to_thread(execute, core, Order(OrderKind.STOP))
        await server.stop()
        core.close()
        ds.shutdown_distributed()
    return 0
