"""The contract every runner passes, importable to test your own runner.

Subclass `RunnerContract` in a test module (its name must start with ``Test``) and give a
``runner`` fixture returning the runner; its children are the agents of this module's
registry (``"orchestrator.runners.contract"``: `agents`), so a runner that rebuilds agents
elsewhere uses that registry::

    import pytest
    from orchestrator.runners.contract import REGISTRY, RunnerContract

    class TestMyRunner(RunnerContract):
        @pytest.fixture
        def runner(self):
            return MyRunner(registry=REGISTRY)

Each test runs a lead agent whose subagent tool runs on the runner, with an SQLite file as
the store (a store both sides open by URL), and checks one guarantee: the child's links, its
answer and usage rolled up, the lead's limits, parallel children, its memory writes,
cancellation (the child records ``interrupted`` and is saved before the call returns), a
failing child, and resume of a child that a crash cut off. The tests are async (the `anyio`
marker): run them with an ``anyio_backend`` fixture (``asyncio``, ``trio`` or both). The suite
needs pytest and anyio.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from .._base._limits import Limits
from .._base._messages import Message, ToolCall
from .._base._stopped import StoppedByLimit
from .._record._history import ToolResultEntry
from .._record._state import State
from .._running._agent import Agent
from .._running._runner import Runner
from .._tooling._memory import Memory
from .._tooling._tools import tool
from ..models import Request
from ..testing._fake_model import FakeModel

__all__ = ("REGISTRY", "RunnerContract", "agents", "child", "copy_sqlite", "crash_during")

REGISTRY = "orchestrator.runners.contract"
"""The registry of the contract's agents, for a runner that rebuilds agents by name."""


def _decide(request: Request) -> Any:
    """The child's next reply, decided from its task.

    ``turns N``, ``remember KEY``, ``wait PATH`` or ``fail``; anything else is answered at once.
    """
    task = request.messages[0].text
    turns = sum(1 for message in request.messages if message.role == "assistant")
    verb, _, arg = task.partition(" ")
    if verb == "fail":
        raise RuntimeError("the model is down")
    if verb == "turns" and turns + 1 < int(arg):
        return ToolCall(f"call_{turns}", "note", {"text": f"step {turns}"})
    if verb in ("remember", "wait") and turns == 0:
        return ToolCall(f"call_{verb}", verb, {"arg": arg})
    return f"answer to {task}"


@tool
def note(text: str) -> str:
    """Take a note.

    Args:
        text: The note.
    """
    return f"noted {text}"


@tool
async def remember(arg: str, memory: Memory) -> str:
    """Remember a key in the child's memory.

    Args:
        arg: The key.
        memory: The child's memory (given by the agent).
    """
    await memory.aset(arg, True)
    return "remembered"


@tool
async def wait(arg: str) -> str:
    """Write this process's id to a file, then wait two minutes (until cancelled).

    Args:
        arg: The file to write.
    """
    await anyio.Path(arg).write_text(str(os.getpid()))
    await anyio.sleep(120)
    return "waited"


def child(store: Any) -> Agent:
    """The contract's child agent, ``contract_child``, saving in `store`."""
    return Agent(
        FakeModel([_decide] * 10_000),
        name="contract_child",
        description="Does one task of the runner contract",
        tools=[note, remember, wait],
        store=store,
    )


def agents(store: Any) -> list[Agent]:
    """The registry of the contract's agents (`REGISTRY`): what a worker rebuilds by name."""
    return [child(store)]


def copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of the SQLite file `source` (its WAL included) at `target`."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


async def crash_during(
    lead: Agent, state: State, db: Path, after: Path, cut: Callable[[], Awaitable[Any]]
) -> None:
    """Run `lead` on `state` until `cut()` returns; copy `db` to `after` then; cancel the run.

    The copy is what a process killed at that moment leaves on disk (every save before a tool
    runs is written), so `after` is the store after a crash.
    """
    async with anyio.create_task_group() as group:
        group.start_soon(lead.arun, state)
        await cut()
        await anyio.to_thread.run_sync(copy_sqlite, db, after)
        group.cancel_scope.cancel()


async def _file_text(path: Path) -> str:
    """The text of `path` once another process wrote it (polled, 60 s at most)."""
    with anyio.fail_after(60):
        while not (await anyio.Path(path).exists() and await anyio.Path(path).read_text()):  # noqa: ASYNC110
            await anyio.sleep(0.05)
        return await anyio.Path(path).read_text()


def _results(state: State) -> list[ToolResultEntry]:
    return [entry for entry in state.history if isinstance(entry, ToolResultEntry)]


def _text(entry: ToolResultEntry) -> str:
    return "".join(getattr(block, "text", "") for block in entry.content.content)


class RunnerContract:
    """The runner contract: subclass it with a ``runner`` fixture (see the module docstring)."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> Any:
        """The shared store: an SQLite file (its URL opens it in any process of the host)."""
        from stores import SQLiteStore

        return SQLiteStore(tmp_path / "runs.db")

    @staticmethod
    def lead(store: Any, runner: Runner, tasks: list[str], answer: str = "done") -> Agent:
        """A lead that gives the child `tasks` in one turn (parallel calls), then answers."""
        calls = [
            ToolCall(f"call_lead_{n}", "contract_child", {"task": t}) for n, t in enumerate(tasks)
        ]
        return Agent(
            FakeModel([calls, answer]),
            name="contract_lead",
            tools=[child(store)],
            store=store,
            runner=runner,
        )

    @pytest.mark.anyio
    async def test_a_child_spends_against_the_leads_limits(
        self, runner: Runner, store: Any
    ) -> None:
        """A child never gets more than the lead's limits left, and its spending counts there."""
        state = State(messages=[Message.user("go")])
        await self.lead(store, runner, ["turns 5"]).arun(state, limits=Limits(requests=3))
        (result,) = _results(state)
        kid = await state.achild(result.child_ids[0])
        assert kid.usage.requests == 2  # the lead's own request left two
        assert isinstance(kid.stopped, StoppedByLimit)
        assert kid.stopped.limit == "requests"
        assert result.outcome == "error"
        assert "limit requests=" in _text(result)
        assert isinstance(state.stopped, StoppedByLimit)
        assert (state.stopped.limit, state.stopped.spent) == ("requests", 3)

    @pytest.mark.anyio
    async def test_a_child_is_linked_and_rolls_up_its_answer_and_usage(
        self, runner: Runner, store: Any
    ) -> None:
        """The child hangs under the call; its answer is the result, its usage is added."""
        state = State(messages=[Message.user("go")])
        assert await self.lead(store, runner, ["turns 3"]).arun(state) == "done"
        (result,) = _results(state)
        (child_id,) = result.child_ids
        assert (result.outcome, _text(result)) == ("done", "answer to turns 3")
        kid = await state.achild(child_id)
        assert (kid.parent_id, kid.parent_call_id) == (state.id, result.call.id)
        assert kid.usage.requests == result.usage.requests == 3
        assert state.usage.requests == 2 + 3
        stored = await store.aload(child_id)
        assert stored.history == kid.history

    @pytest.mark.anyio
    async def test_parallel_children_each_answer_their_own_call(
        self, runner: Runner, store: Any
    ) -> None:
        """Children of one turn each answer their own call."""
        state = State(messages=[Message.user("go")])
        tasks = ["turns 1", "turns 2", "turns 3"]
        await self.lead(store, runner, tasks).arun(state)
        found = sorted(_results(state), key=lambda result: result.call.id)  # in request order
        assert [_text(r) for r in found] == [f"answer to {t}" for t in tasks]
        assert len({r.child_ids[0] for r in found}) == 3
        assert state.usage.requests == 2 + 1 + 2 + 3

    @pytest.mark.anyio
    async def test_a_childs_memory_writes_are_kept_in_the_shared_store(
        self, runner: Runner, store: Any
    ) -> None:
        """A child's memory writes land in the shared store."""
        await self.lead(store, runner, ["remember a", "remember b"]).arun("go")
        memory = Memory.open("contract_child", None, store)
        assert (await memory.aget("a"), await memory.aget("b")) == (True, True)

    @pytest.mark.anyio
    async def test_cancelling_the_parent_interrupts_the_child_which_is_saved(
        self, runner: Runner, store: Any, tmp_path: Path
    ) -> None:
        """Cancelling the parent stops the child: ``interrupted``, saved before the call returns."""
        marker = tmp_path / "waiting"
        state = State(messages=[Message.user("go")])
        async with anyio.create_task_group() as group:
            group.start_soon(self.lead(store, runner, [f"wait {marker}"]).arun, state)
            await _file_text(marker)
            group.cancel_scope.cancel()
        (result,) = _results(state)
        assert result.outcome == "interrupted"
        kid = await store.aload(result.child_ids[0])
        assert [r.outcome for r in _results(kid)] == ["interrupted"]

    @pytest.mark.anyio
    async def test_a_failing_child_gives_the_parent_an_error_result(
        self, runner: Runner, store: Any
    ) -> None:
        """A child whose run fails gives the parent's call an error result."""
        state = State(messages=[Message.user("go")])
        await self.lead(store, runner, ["fail"], answer="noted").arun(state)
        (result,) = _results(state)
        assert result.outcome == "error"
        assert "the model is down" in _text(result)
        assert len(result.child_ids) == 1

    @pytest.mark.anyio
    async def test_a_cut_off_child_resumes_from_its_history(
        self, runner: Runner, store: Any, tmp_path: Path
    ) -> None:
        """After a crash, the parent's next run continues the child and gets its answer."""
        from stores import SQLiteStore

        marker = tmp_path / "waiting"
        state = State(messages=[Message.user("go")])
        after = tmp_path / "after.db"
        lead = self.lead(store, runner, [f"wait {marker}"])
        await crash_during(lead, state, Path(store.path), after, lambda: _file_text(marker))
        await anyio.Path(marker).unlink()
        restarted = SQLiteStore(after)
        loaded = await restarted.aload(state.id)
        again = Agent(
            FakeModel(["resumed"]),
            name="contract_lead",
            tools=[child(restarted)],
            store=restarted,
            runner=runner,
        )
        assert await again.arun(loaded) == "resumed"
        assert not await anyio.Path(marker).exists()  # the cut-off `wait` never ran again
        delivered = _results(loaded)[-1]
        assert (delivered.late, delivered.outcome) == (True, "done")
        assert _text(delivered) == f"answer to wait {marker}"
        kid = await restarted.aload(delivered.child_ids[0])
        assert [r.outcome for r in _results(kid)] == ["unknown"]
        assert kid.usage.requests == 2  # one before the crash, one after
