"""The seed's example end to end: a digest agent tracks open loops across two runs.

The first run happens in another process (this file run as a script, with `sys.executable`);
the second runs here, against the same SQLite file or FileStore folder, and sees the loops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Agent, Memory, Message, State, ToolCall, tool
from orchestrator.testing import FakeModel, tool_call
from stores import FileStore, SQLiteStore
from tests.doubles import Loop, results

ROOT = Path(__file__).resolve().parents[2]


@tool
async def count_open_loops(memory: Memory) -> int:
    """Counts the open loops."""
    open_loops = await memory.collection("loops").alist(where={"status": "open"})
    return len(open_loops)


@tool
def last_uid(memory: Memory) -> int | None:
    """The last mail uid read (a sync tool: it runs in a worker thread)."""
    return memory.get("lastUid")


def digest_agent(model: FakeModel, store: Any) -> Agent:
    return Agent(
        model,
        name="digest",
        instructions="Track open loops across days.",
        store=store,
        collections={"loops": Loop},
        tools=[count_open_loops, last_uid],
    )


def open_store(kind: str, path: Path) -> Any:
    return SQLiteStore(path / "digest.db") if kind == "sqlite" else FileStore(path / "runs")


def first_run(kind: str, path: Path) -> None:
    """Day one: the model files three loops and the agent remembers the last mail read."""
    store = open_store(kind, path)
    model = FakeModel(
        [
            [
                tool_call(
                    "state_loops_upsert",
                    id="reply-anna",
                    doc={"title": "Reply to Anna", "status": "open"},
                ),
                tool_call(
                    "state_loops_upsert",
                    id="call-bob",
                    doc={"title": "Call Bob", "status": "open", "due": "friday"},
                ),
                tool_call(
                    "state_loops_upsert",
                    id="pay-rent",
                    doc={"title": "Pay the rent", "status": "resolved"},
                ),
            ],
            "Three loops filed.",
        ]
    )
    agent = digest_agent(model, store)
    answer = agent.run("Here is today's mail.")
    agent.memory.set("lastUid", 1042)
    print(json.dumps({"answer": answer, "loops": len(agent.memory.collection("loops").list())}))
    close = getattr(store, "close", None)
    if close is not None:
        close()


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_a_digest_agent_tracks_open_loops_across_two_runs_in_two_processes(
    kind: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, __file__, kind, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"answer": "Three loops filed.", "loops": 3}

    # Day two, in this process: the model counts and lists the open loops, resolves one.
    store = open_store(kind, tmp_path)
    counting, listing, uid = (
        tool_call("count_open_loops"),
        tool_call("state_loops_list", where={"status": "open"}),
        tool_call("last_uid"),
    )
    resolve = ToolCall(
        "resolve-1",
        "state_loops_upsert",
        {"id": "reply-anna", "doc": {"title": "Reply to Anna", "status": "resolved"}},
    )
    model = FakeModel([[counting, listing, uid], resolve, "One loop left: call Bob."])
    agent = digest_agent(model, store)
    state = State(id="day-2", messages=[Message.user("What is still open?")])
    assert agent.run(state) == "One loop left: call Bob."
    seen = {entry.call.id: entry for entry in results(state)}
    assert seen[counting.id].content.text == "2"
    assert [loop["id"] for loop in json.loads(seen[listing.id].content.text)] == [
        "call-bob",
        "reply-anna",
    ]
    assert seen[uid.id].content.text == "1042"
    assert not seen[resolve.id].content.is_error

    loops = agent.memory.collection("loops")
    assert loops.list(where={"status": "open"}) == [
        {"id": "call-bob", "title": "Call Bob", "status": "open", "due": "friday"}
    ]
    assert [loop["id"] for loop in loops.list(where={"status": "resolved"})] == [
        "pay-rent",
        "reply-anna",
    ]
    assert agent.memory.get("lastUid") == 1042
    # Another agent in the same store sees none of it; the States of both days are there too.
    other = Memory.open("other", {"loops": Loop}, store)
    assert other.collection("loops").list() == []
    assert other.get("lastUid") is None
    assert len(store.list()) == 2
    close = getattr(store, "close", None)
    if close is not None:
        close()


if __name__ == "__main__":
    first_run(sys.argv[1], Path(sys.argv[2]))
