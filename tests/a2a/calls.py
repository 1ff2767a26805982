"""What the A2A call tests share."""

from __future__ import annotations

import anyio

from orchestrator.a2a import TASK_KEY
from stores import MemoryStore

__all__ = ("recorded_task",)


async def recorded_task(store: MemoryStore) -> str:
    """The remote task id a child State of `store` recorded, once one did (polled)."""
    for _ in range(1000):
        for info in store.list():
            if info.parent_id is not None:
                recorded = store.load(info.id).get(TASK_KEY)
                if recorded and recorded.get("task_id"):
                    return str(recorded["task_id"])
        await anyio.sleep(0.01)
    raise AssertionError("no child recorded a remote task")
