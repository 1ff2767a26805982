"""Children on a cluster: a lead's researchers run on Ray workers, saved in a shared store.

Run it with ``python examples/distributed.py`` (``pip install 'orchestrator[ray]'``): it starts
a local Ray cluster in this process, or joins one with ``--address auto`` (after ``ray start
--head``). ``--store`` names the shared store by URL (``postgresql://...`` on a real cluster);
by default an SQLite file in a temporary folder, which the workers of one machine share.

The workers rebuild the researcher by name from this module's `agents` (the registry,
``RayRunner("distributed")``: the workers import this file as ``distributed``, from the
driver's ``sys.path``). The models are `FakeModel`s, so it runs offline.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from orchestrator import Agent, Message, State, ToolCall, ToolResultEntry, tool
from orchestrator.models import Request
from orchestrator.testing import FakeModel

FACTS = {
    "pool": "release 4.2 cut the checkout database pool from 50 to 5 connections",
    "alert": "only the error rate was alerted on, so detection took 5 minutes",
    "fix": "the pool size is now checked in review and alerted on at 80%",
}


@tool
def lookup(topic: str) -> str:
    """Look a topic up in the postmortem.

    Args:
        topic: One of pool, alert, fix.
    """
    return f"{FACTS.get(topic, 'nothing found')} (worker pid {os.getpid()})"


def research(request: Request) -> Any:
    """The researcher's model: look the topic up, then answer with what it found."""
    topic = request.messages[0].text.split()[-1]
    last = request.messages[-1]
    if last.role == "user" and not last.tool_results:
        return ToolCall(f"call_{topic}", "lookup", {"topic": topic})
    found = last.tool_results[0].content[0]
    return f"{topic}: {getattr(found, 'text', '')}"


def researcher(store: Any) -> Agent:
    """The researcher: one topic per child, saved in `store`."""
    return Agent(
        FakeModel([research] * 100),
        name="researcher",
        description="Looks one topic up in the postmortem",
        tools=[lookup],
        store=store,
    )


def agents(store: Any) -> list[Agent]:
    """The registry: the agents a worker rebuilds by name, on the store it opened by URL."""
    return [researcher(store)]


def summarize(request: Request) -> str:
    """The lead's model, once the researchers answered: one line per finding."""
    lines = [
        getattr(result.content[0], "text", "")
        for message in request.messages
        for result in message.tool_results
    ]
    return "Findings:\n" + "\n".join(f"- {line.split(' (worker pid')[0]}" for line in lines)


def main() -> None:
    """Start (or join) a cluster, run the lead, print the answer and the tree."""
    from orchestrator.runners import RayRunner
    from stores import open_store

    ray: Any = importlib.import_module("ray")  # `import ray`, typed loosely: its stubs are partial
    parser = argparse.ArgumentParser(description="Children on a cluster (Ray).")
    parser.add_argument("--address", help="a Ray cluster to join (e.g. auto); default: local")
    parser.add_argument("--store", help="the shared store's URL; default: an SQLite file")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="distributed-")
    url = args.store or f"sqlite:///{Path(folder, 'runs.db')}"
    if args.address:
        ray.init(address=args.address, logging_level=logging.ERROR, log_to_driver=False)
    else:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=80 * 1024 * 1024,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    store = open_store(url)
    runner = RayRunner("distributed", actors=2)
    calls = [ToolCall(f"call_{t}", "researcher", {"task": f"Look up {t}"}) for t in FACTS]
    lead = Agent(
        FakeModel([calls, summarize]),
        name="lead",
        tools=[researcher(store)],
        store=store,
        runner=runner,
    )
    state = State(messages=[Message.user("What happened in the checkout outage?")])
    try:
        print(lead.run(state))
        results = [e for e in state.history if isinstance(e, ToolResultEntry)]
        children = [state.child(result.child_ids[0]) for result in results]
        linked = all(
            (child.parent_id, child.parent_call_id) == (state.id, result.call.id)
            for child, result in zip(children, results, strict=True)
        )
        print(f"children: {len(children)}, each linked to its call: {linked}")
        found = [e for child in children for e in child.history if isinstance(e, ToolResultEntry)]
        texts = [getattr(e.content.content[0], "text", "") for e in found]
        pids = {text.rsplit(" ", 1)[-1].rstrip(")") for text in texts}
        print(f"ran outside this process: {str(os.getpid()) not in pids}")
        print(f"requests: {state.usage.requests} (the lead 2, each researcher 2)")
    finally:
        runner.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
