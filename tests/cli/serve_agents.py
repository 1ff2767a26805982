"""Agents for `orchestrator serve` tests: one that answers, one whose tool waits forever."""

from __future__ import annotations

from typing import Any

import anyio

from orchestrator import Agent, tool
from orchestrator.models import Request
from orchestrator.permissions import AllowByName
from orchestrator.testing import FakeModel, tool_call


@tool
async def wait_forever() -> str:
    """Wait until cancelled."""
    await anyio.sleep_forever()
    return "never"


def _reply(request: Request) -> Any:
    text = request.messages[-1].text
    return tool_call("wait_forever") if text == "wait" else f"echo: {text}"


def build() -> list[Agent]:
    """The agents the service runs."""
    return [
        Agent(
            FakeModel([_reply] * 100),
            name="echo",
            tools=[wait_forever],
            permissions=[AllowByName("wait_forever")],
        )
    ]


def not_agents() -> int:
    """Returns no agents."""
    return 3
