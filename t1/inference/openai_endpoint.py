"""One endpoint of the OpenAI pool: its client, slots, health and weights version; and the refusal error.

Shared by the pool (t1.inference.openai_pool), which sends requests, and the weight reload
(t1.inference.openai_weights), which drains an endpoint and loads a weights folder on it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx

from t1.config.inference import OpenAIEndpointConfig
from t1.errors import InfraError


class EndpointRefused(InfraError, RuntimeError):
    """The endpoint refused the request for a reason a retry does not change (auth, a 4xx, no token ids)."""


@dataclass(slots=True)
class Endpoint:
    """One OpenAI-compatible server as the pool sees it: its client, its slots, its health and weights version."""

    cfg: OpenAIEndpointConfig
    client: httpx.AsyncClient
    slots: asyncio.Semaphore
    outstanding: int = 0
    unhealthy_until: float = 0.0
    version: int = 0
    open: asyncio.Event = field(default_factory=asyncio.Event)  # cleared while its weights are reloaded
    sync_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one weight load at a time

    def healthy(self, now: float) -> bool:
        return now >= self.unhealthy_until
