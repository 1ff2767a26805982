"""The local Ray cluster of the Ray tests: started once, only in a loopback-only namespace."""

from __future__ import annotations

import importlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest


def only_loopback() -> bool:
    """Whether this process sees no network interface but the loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """`ray`, joined to a local cluster (2 CPUs, no dashboard) for the whole session."""
    if not only_loopback():
        interfaces = [name for _, name in socket.if_nameindex()]
        pytest.fail(
            "The Ray tests run only in a private network namespace with just the loopback up"
            f" (here: {interfaces}), because Ray binds to the external interface: run"
            " scripts/in_netns.sh .venv/bin/python -m pytest -m ray tests/runners (make unit"
            " does)."
        )
    ray: Any = importlib.import_module("ray")  # its stubs are partly untyped
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
