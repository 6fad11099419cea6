"""TITO test fixtures: the two template families of tito_families.py."""

from __future__ import annotations

import pytest
from tito_families import Family, get_family


@pytest.fixture(params=["chatml", "llama3"])
def family(request) -> Family:
    return get_family(request.param)
