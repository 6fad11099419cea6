"""Routing test fixtures: a tiny in-memory Qwen3-MoE (routing_models.py)."""

from __future__ import annotations

import pytest
from routing_models import tiny_qwen3_moe


@pytest.fixture
def qwen3_moe():
    return tiny_qwen3_moe()
