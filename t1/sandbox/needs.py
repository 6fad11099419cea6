"""What a task needs that this host or provider cannot give: an image, the network, or a feature.

A task that cannot run here is not a setup failure: it is refused with a `needs_*`
report that names what is missing (the Dockerfile line, the apt or pip packages,
the task.toml field). `t1 tasks validate` predicts these from the task folder
alone; running the task raises the same errors from the same checks, so a task
validate called runnable is refused at run time only for a reason validate
could not see (a package a RUN line installs that only the installer knew).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from t1.errors import InfraError


class NeedKind(StrEnum):
    """What kind of thing is missing."""

    IMAGE = "needs_image"  # a container image build (multi-stage, ENTRYPOINT, compose services, ...)
    NETWORK = "needs_network"  # packages or downloads an offline sandbox cannot fetch
    FEATURE = "needs_feature"  # a task.toml feature T1 does not provide (GPUs, MCP servers, ...)


@dataclass(frozen=True, slots=True)
class Need:
    """One reason a task will not run here: its kind and a sentence naming the missing thing."""

    kind: NeedKind
    what: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.what}"


class NeedsError(InfraError, ValueError):
    """The task cannot run on this host or provider; `need` says what is missing."""

    kind = NeedKind.IMAGE

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.need = Need(self.kind, what)


class NeedsImageError(NeedsError):
    """The task's environment cannot be built in a local sandbox: it needs a container image."""

    kind = NeedKind.IMAGE


class NeedsNetworkError(NeedsError):
    """Setup needs packages or downloads that are not on this host, and the sandbox is offline."""

    kind = NeedKind.NETWORK


class NeedsFeatureError(NeedsError):
    """The task asks for a feature T1 does not provide (named by its task.toml field)."""

    kind = NeedKind.FEATURE


ERRORS: dict[NeedKind, type[NeedsError]] = {
    NeedKind.IMAGE: NeedsImageError, NeedKind.NETWORK: NeedsNetworkError, NeedKind.FEATURE: NeedsFeatureError,
}


def raise_need(need: Need) -> None:
    """Raise the NeedsError subclass for `need`."""
    raise ERRORS[need.kind](need.what)
