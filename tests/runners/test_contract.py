"""Both runners pass the runner contract (`orchestrator.runners.contract`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.runners import LocalRunner, RayRunner
from orchestrator.runners.contract import REGISTRY, RunnerContract


class TestLocalRunner(RunnerContract):
    @pytest.fixture
    def runner(self) -> LocalRunner:
        return LocalRunner()


@pytest.mark.ray
class TestRayRunner(RunnerContract):
    @pytest.fixture
    def runner(self, ray_cluster: Any) -> Iterator[RayRunner]:
        runner = RayRunner(REGISTRY, actors=2)
        yield runner
        runner.shutdown()
