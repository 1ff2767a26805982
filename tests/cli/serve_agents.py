"""Agents for `orchestrator serve` tests: one that answers, one whose tool waits forever."""

from __future__ import annotations

from typing import Any

import anyio

from orchestrator import Agent, tool
from orchestrator.models import Request
from orchestrator.permissions import AllowByName, ApproveLater
from orchestrator.testing import FakeModel, tool_call


@tool
async def wait_forever() -> str:
    """Wait until cancelled."""
    await anyio.sleep_forever()
    return "never"


@tool
def send(to: str) -> str:
    """Send a message (a person approves it first)."""
    return f"sent to {to}"


def _reply(request: Request) -> Any:
    last = request.messages[-1]
    if last.role == "user" and last.text == "wait":
        return tool_call("wait_forever")
    if last.role == "user" and last.text.startswith("mail "):
        return tool_call("send", to=last.text.removeprefix("mail "))
    if last.role == "user" and not last.text:  # a tool's result
        return "done"
    return f"echo: {last.text}"


def build() -> list[Agent]:
    """The agents the service runs."""
    return [
        Agent(
            FakeModel([_reply] * 100),
            name="echo",
            tools=[wait_forever, send],
            permissions=[AllowByName("wait_forever"), ApproveLater("send")],
        )
    ]


def not_agents() -> int:
    """Returns no agents."""
    return 3
