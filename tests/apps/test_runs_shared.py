"""Two `Runs` services on one store: each sees, follows, cancels and continues the other's runs.

Two services in one process stand for two processes here (each has its own owner token, as a
process does); tests/apps/test_runs_processes.py runs them as real processes.
"""

from __future__ import annotations

import anyio
import pytest

from orchestrator import StoppedByApproval
from orchestrator.apps import Runs
from stores import MemoryStore
from tests.apps.test_runs import GATES, SENT, gate, helper_agent

pytestmark = pytest.mark.anyio

LEASE = 0.25  # seconds: short, so cancels are seen and dead leases run out quickly


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()
    GATES.clear()


async def test_a_run_in_one_service_is_running_in_the_other_and_cannot_start_there() -> None:
    store = MemoryStore()
    async with (
        Runs([helper_agent()], store, lease=LEASE) as a,
        Runs([helper_agent()], store, lease=LEASE) as b,
    ):
        assert a.owner != b.owner
        handle = await a.start("helper", "hold one")
        await gate("one").entered.wait()
        assert (await b.get(handle.state_id)).status == "running"
        assert [(info.state_id, info.status) for info in await b.list()] == [
            (handle.state_id, "running")
        ]
        with pytest.raises(ValueError, match="running in another process"):
            await b.start("helper", "more", state_id=handle.state_id)
        with pytest.raises(ValueError, match="running in another process"):
            await b.approve(handle.state_id, "call_x")
        gate("one").release.set()
        await handle.wait()
        assert (await b.get(handle.state_id)).status == "answered"


async def test_a_cancel_from_the_other_service_is_recorded_then_seen_by_the_owner() -> None:
    store = MemoryStore()
    async with (
        Runs([helper_agent()], store, lease=LEASE) as a,
        Runs([helper_agent()], store, lease=LEASE) as b,
    ):
        handle = await a.start("helper", "hold two")
        await gate("two").entered.wait()
        info = await b.cancel(handle.state_id)
        assert info.status == "idle"
        assert a.running == ()
    outcomes = [e.outcome for e in store.load(handle.state_id).history if e.kind == "tool_result"]
    assert outcomes == ["interrupted"]


async def test_a_decision_in_the_other_service_continues_the_run_there() -> None:
    store = MemoryStore()
    async with (
        Runs([helper_agent()], store, lease=LEASE) as a,
        Runs([helper_agent()], store, lease=LEASE) as b,
    ):
        handle = await a.start("helper", "mail zoe")
        stopped = (await handle.wait()).stopped
        assert isinstance(stopped, StoppedByApproval)
        following = b.follow(handle.state_id, since=(await b.get(handle.state_id)).entries)
        await following.ready()
        assert (await b.approve(handle.state_id, stopped.calls[0].call.id)).status == "running"
        assert b.running == (handle.state_id,)
        assert (await a.get(handle.state_id)).status == "running"
        kinds = [item.event.kind async for item in following]
        assert kinds == ["run_start", "tool_end", "model_reply", "run_end"]
    assert SENT == ["zoe"]


async def test_the_other_service_follows_a_run_to_its_end() -> None:
    store = MemoryStore()
    async with (
        Runs([helper_agent()], store, lease=LEASE) as a,
        Runs([helper_agent()], store, lease=LEASE) as b,
    ):
        handle = await a.start("helper", "hold three")
        await gate("three").entered.wait()
        kinds: list[str] = []
        async with anyio.create_task_group() as group:

            async def follow() -> None:
                async for item in b.follow(handle.state_id):
                    kinds.append(item.event.kind)

            group.start_soon(follow)
            gate("three").release.set()
    assert kinds == ["run_start", "model_reply", "tool_end", "model_reply", "run_end"]


async def test_a_run_whose_process_died_can_be_taken_over_once_its_lease_runs_out() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store, lease=LEASE) as b:
        handle = await b.start("helper", "say first")
        await handle.wait()
        # A process that died while running it: its lease is there, and nobody renews it.
        assert await store.aclaim_run(handle.state_id, "dead-process", seconds=LEASE) is None
        assert (await b.get(handle.state_id)).status == "running"
        with pytest.raises(ValueError, match="dead-process"):
            await b.start("helper", "say again", state_id=handle.state_id)
        followed = [item.event.kind async for item in b.follow(handle.state_id)]
        assert followed == ["run_start", "model_reply", "run_end"]  # its stored run ended
        with anyio.fail_after(10):
            while True:  # until the dead lease runs out
                if (await b.get(handle.state_id)).status != "running":
                    break
                await anyio.sleep(LEASE / 5)
        again = await b.start("helper", "say again", state_id=handle.state_id)
        assert (await again.wait()).status == "answered"
    assert store.load(handle.state_id).answer == "done: say again"


async def test_leases_refuse_bad_arguments() -> None:
    store = MemoryStore()
    with pytest.raises(TypeError, match="owner"):
        await store.aclaim_run("s", "", seconds=1)
    with pytest.raises(ValueError, match="seconds"):
        await store.aclaim_run("s", "me", seconds=0)
    with pytest.raises(TypeError, match="state_id"):
        await store.arequest_cancel("")
    with pytest.raises(ValueError, match="lease"):
        Runs([helper_agent()], store, lease=0)
