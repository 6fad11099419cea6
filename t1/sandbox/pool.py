"""SandboxPool: bounded, fault-tolerant acquisition of sandboxes from any provider.

`async with pool.acquire(request) as sandbox:` waits (up to `acquire_timeout_s`) for one of
`max_sandboxes` slots, creates a sandbox under a creation-rate cap, health-checks it, retries a
failed create with exponential backoff, and quarantines inventory hosts that keep failing. On exit
the sandbox is always destroyed (or, for the ssh inventory, reset), also when the body raised.
`async with pool.reattach(record) as sandbox:` does the same for a sandbox an earlier coordinator
created (`SandboxProvider.reattach`): it takes a slot, reattaches and health-checks it (SandboxGone
when it is gone or unhealthy), and destroys it when the block exits.
Counts go to Prometheus gauges and counters and to `pool.stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from t1.config.sandbox import PoolConfig
from t1.sandbox.ssh.remote import NoFreeHost, SandboxCreateError
from t1.sandbox.ssh.ssh_sandbox import SshSandbox
from t1.sandbox.types import (
    Sandbox,
    SandboxGone,
    SandboxLost,
    SandboxProvider,
    SandboxRecord,
    SandboxRequest,
)

log = logging.getLogger(__name__)

NO_HOST_POLL_S = 0.5
CLOSE_CONCURRENCY = 32  # destroys in flight at once when the pool closes


class PoolMetrics:
    """The pool's Prometheus series (one set per registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.active = Gauge("t1_sandbox_active", "Sandboxes handed out.", registry=registry)
        self.creating = Gauge("t1_sandbox_creating", "Sandbox creates in flight.", registry=registry)
        self.quarantined = Gauge("t1_sandbox_quarantined", "Hosts in quarantine.", registry=registry)
        self.failed = Counter("t1_sandbox_failed", "Failed creates, health checks, destroys and lost sandboxes.",
                              ["stage"], registry=registry)
        self.created = Counter("t1_sandbox_created", "Sandboxes created and healthy.", registry=registry)


_DEFAULT_METRICS: PoolMetrics | None = None


def default_metrics() -> PoolMetrics:
    global _DEFAULT_METRICS
    if _DEFAULT_METRICS is None:
        _DEFAULT_METRICS = PoolMetrics(REGISTRY)
    return _DEFAULT_METRICS


@dataclass(slots=True)
class PoolStats:
    """Plain counters mirroring the metrics (for tests and status pages)."""

    active: int = 0
    creating: int = 0
    created: int = 0
    create_failures: int = 0
    health_failures: int = 0
    destroy_failures: int = 0
    lost: int = 0


class HostHealth:
    """Consecutive failures per host; a host past the limit sits out `quarantine_s`."""

    def __init__(self, limit: int, quarantine_s: float) -> None:
        self.limit, self.quarantine_s = limit, quarantine_s
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}

    def failed(self, host: str) -> bool:
        """Record a failure; True when this one put the host in quarantine."""
        self._failures[host] = self._failures.get(host, 0) + 1
        if self._failures[host] >= self.limit:
            self._until[host] = time.monotonic() + self.quarantine_s
            self._failures[host] = 0
            log.warning("sandbox host %s quarantined for %.0fs", host, self.quarantine_s)
            return True
        return False

    def succeeded(self, host: str) -> None:
        self._failures.pop(host, None)

    def is_quarantined(self, host: str) -> bool:
        until = self._until.get(host)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._until[host]
            return False
        return True

    def num_quarantined(self) -> int:
        return sum(self.is_quarantined(h) for h in list(self._until))


class SandboxPool:
    """Hands out sandboxes from `provider` with the limits in `cfg`."""

    def __init__(self, provider: SandboxProvider, cfg: PoolConfig, *, metrics: PoolMetrics | None = None) -> None:
        self.provider = provider
        self.cfg = cfg
        self.metrics = metrics or default_metrics()
        self.stats = PoolStats()
        self.health = HostHealth(cfg.quarantine_after, cfg.quarantine_s)
        if hasattr(provider, "is_quarantined"):
            provider.is_quarantined = self.health.is_quarantined
        self.max_sandboxes = min(cfg.max_sandboxes, int(getattr(provider, "capacity", cfg.max_sandboxes)))
        self._slots = asyncio.Semaphore(self.max_sandboxes)
        self._rate_lock = asyncio.Lock()
        self._next_create = 0.0
        self._live: set[Sandbox] = set()
        self._closed = False

    @contextlib.asynccontextmanager
    async def acquire(
        self, request: SandboxRequest | None = None, timeout_s: float | None = None
    ) -> AsyncIterator[Sandbox]:
        """A healthy sandbox for the duration of the block; destroyed (or reset) afterwards."""
        async with self._hold(
            lambda deadline: self._create(request or SandboxRequest(), deadline), timeout_s
        ) as sandbox:
            yield sandbox

    @contextlib.asynccontextmanager
    async def reattach(self, record: SandboxRecord, timeout_s: float | None = None) -> AsyncIterator[Sandbox]:
        """The live sandbox `record` names (an earlier coordinator's), healthy, for the duration of the block;
        destroyed (or reset) afterwards. SandboxGone when it cannot be reattached or fails its health check."""
        async with self._hold(lambda deadline: self._reattach(record), timeout_s) as sandbox:
            yield sandbox

    @contextlib.asynccontextmanager
    async def _hold(
        self, get: Callable[[float], Awaitable[Sandbox]], timeout_s: float | None
    ) -> AsyncIterator[Sandbox]:
        """A slot, the sandbox `get(deadline)` gives, and its release when the block exits."""
        if self._closed:
            raise RuntimeError("acquire() on a closed SandboxPool")
        timeout = self.cfg.acquire_timeout_s if timeout_s is None else timeout_s
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout)
        except TimeoutError:
            raise TimeoutError(f"no sandbox slot free within {timeout:.1f}s "
                               f"(pool.max_sandboxes={self.max_sandboxes})") from None
        try:
            sandbox = await get(time.monotonic() + timeout)
            self._live.add(sandbox)
            self._set_active(+1)
            lost = False
            try:
                yield sandbox
            except SandboxLost:
                lost = True
                raise
            finally:
                self._set_active(-1)
                self._live.discard(sandbox)
                await self._release(sandbox, lost or not _alive(sandbox))
        finally:
            self._slots.release()

    async def _reattach(self, record: SandboxRecord) -> Sandbox:
        sandbox = await self.provider.reattach(record)
        problem = await self._health_problem(sandbox)
        if problem is not None:
            self._count_failure("health", None)
            await self._destroy_quietly(sandbox)
            raise SandboxGone(f"sandbox {record.sandbox_id} reattached but failed its health check: {problem}")
        return sandbox

    def _set_active(self, delta: int) -> None:
        self.stats.active += delta
        self.metrics.active.inc(delta)

    async def _throttle(self) -> None:
        """Space creates at least 1/max_creates_per_s apart."""
        async with self._rate_lock:
            now = time.monotonic()
            wait = self._next_create - now
            self._next_create = max(now, self._next_create) + 1.0 / self.cfg.max_creates_per_s
        if wait > 0:
            await asyncio.sleep(wait)

    async def _create(self, request: SandboxRequest, deadline: float) -> Sandbox:
        last: BaseException | None = None
        attempt = 0
        while attempt <= self.cfg.create_retries:
            if attempt:
                await asyncio.sleep(self.cfg.backoff_s * 2 ** (attempt - 1))
            attempt += 1
            await self._throttle()
            self.stats.creating += 1
            self.metrics.creating.inc()
            try:
                sandbox = await self.provider.create(request)
            except NoFreeHost as exc:  # not a failure: wait for a host to come back, within the deadline
                if time.monotonic() + NO_HOST_POLL_S > deadline:
                    raise TimeoutError(f"no sandbox host free before the acquire deadline: {exc}") from None
                attempt -= 1
                await asyncio.sleep(NO_HOST_POLL_S)
                continue
            except (SandboxLost, SandboxCreateError, OSError) as exc:
                last = exc
                self._count_failure("create", getattr(exc, "host", None))
                log.warning("sandbox create failed (attempt %d/%d): %s", attempt, self.cfg.create_retries + 1, exc)
                continue
            finally:
                self.stats.creating -= 1
                self.metrics.creating.dec()
            problem = await self._health_problem(sandbox)
            if problem is None:
                self.stats.created += 1
                self.metrics.created.inc()
                self.health.succeeded(sandbox.id)
                return sandbox
            last = SandboxLost(f"sandbox {sandbox.id} failed its health check: {problem}")
            self._count_failure("health", sandbox.id)
            await self._destroy_quietly(sandbox)
        raise SandboxLost(f"could not get a healthy sandbox after {self.cfg.create_retries + 1} attempts: "
                          f"{last}") from last

    def _count_failure(self, stage: str, host: str | None) -> None:
        if stage == "create":
            self.stats.create_failures += 1
        elif stage == "health":
            self.stats.health_failures += 1
        elif stage == "destroy":
            self.stats.destroy_failures += 1
        else:
            self.stats.lost += 1
        self.metrics.failed.labels(stage).inc()
        if host is not None and self.health.failed(host):
            self.metrics.quarantined.set(self.health.num_quarantined())

    async def _health_problem(self, sandbox: Sandbox) -> str | None:
        if not self.cfg.health_check or not isinstance(sandbox, SshSandbox):
            return None
        try:
            result = await asyncio.wait_for(sandbox.exec("echo t1-ok", timeout_s=self.cfg.health_check_timeout_s),
                                            self.cfg.health_check_timeout_s)
        except (SandboxLost, TimeoutError, OSError) as exc:
            return str(exc) or type(exc).__name__
        if result.exit_status != 0 or "t1-ok" not in str(result.stdout):
            return f"exit {result.exit_status}, output {str(result.stdout)[:200]!r}"
        return None

    async def _release(self, sandbox: Sandbox, lost: bool) -> None:
        if lost:
            self._count_failure("lost", sandbox.id)
        await self._destroy_quietly(sandbox)

    async def _destroy_quietly(self, sandbox: Sandbox) -> None:
        """Destroy, and count (not raise) a failure: release must never mask the body's outcome."""
        try:
            await asyncio.shield(self.provider.destroy(sandbox))
        except Exception as exc:  # fault tolerance is the point here: count, log, go on
            self._count_failure("destroy", getattr(exc, "host", None) or sandbox.id)
            log.warning("destroying sandbox %s failed: %s", sandbox.id, exc)

    async def close(self, timeout_s: float | None = None) -> None:
        """Destroy sandboxes still out, CLOSE_CONCURRENCY at a time, then close the provider. With `timeout_s`,
        destroys still running at that bound are abandoned (counted and logged) and the provider is closed."""
        self._closed = True
        live = list(self._live)
        slots = asyncio.Semaphore(CLOSE_CONCURRENCY)

        async def destroy(sandbox: Sandbox) -> None:
            async with slots:
                await self._destroy_quietly(sandbox)

        tasks = [asyncio.ensure_future(destroy(s)) for s in live]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
            if late:
                self.stats.destroy_failures += len(late)
                self.metrics.failed.labels("destroy").inc(len(late))
                log.error("closing the sandbox pool: %d of %d destroys did not end within %.1fs; abandoned",
                          len(late), len(live), timeout_s)
        await self.provider.close()


def _alive(sandbox: Sandbox) -> bool:
    return bool(getattr(sandbox, "alive", True))
