"""Shared test configuration: every async test runs on asyncio and on trio."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each `@pytest.mark.anyio` test once per backend."""
    return str(request.param)
