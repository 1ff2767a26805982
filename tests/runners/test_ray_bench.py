"""The runner benchmark runs (at a tiny size), and counts what a resume asks again.

No timing is asserted: the numbers are for `make bench`.
"""

from __future__ import annotations

import pytest

from benchmarks.ray_bench import bench_ray

pytestmark = pytest.mark.ray


def test_the_runner_rows_are_measured_and_a_resume_asks_nothing_finished_again() -> None:
    said: list[str] = []
    metrics = {m.key: m for m in bench_ray(quick=True, progress=said.append)}
    assert said == ["runners (Ray, in a loopback-only network namespace) ..."]
    assert set(metrics) == {
        "runners.ray.dispatch_ms",
        "runners.local.dispatch_ms",
        "runners.ray.fanout_s",
        "runners.ray.fanout_concurrency",
        "runners.local.fanout_s",
        "runners.local.fanout_concurrency",
        "runners.ray.resume_requests",
        "runners.ray.resume_s",
    }
    assert all(m.value > 0 for m in metrics.values())
    resume = metrics["runners.ray.resume_requests"]
    assert resume.ok is True, resume  # the requests made are what the unfinished work needs
    assert metrics["runners.local.fanout_concurrency"].value == 20  # every child at once
