"""The demo's agents: a desk agent that looks things up and asks a mailer subagent to send mail.

Offline by default: `DemoModel` plays each agent's part (text streamed in chunks). With
``OPENAI_API_KEY`` set, both agents use a real model instead. Sending mail is deferred to a
person (`ApproveLater`), so every run stops once for an approval.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

from orchestrator import Agent, Message, Reply, ToolCall, Usage, tool
from orchestrator.models import Model, Request
from orchestrator.permissions import ApproveLater


class DemoModel(Model):
    """A scripted offline model: first the calls it is given, then a final answer."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]], answer: str, latency: float):
        self._calls = calls
        self._answer = answer
        self._latency = latency

    @property
    def name(self) -> str:
        return "demo"

    @property
    def context_window(self) -> int:
        return 100_000

    async def respond(self, request: Request, *, on_text: Any = None) -> Reply:
        await anyio.sleep(self._latency)
        if not any(message.tool_results for message in request.messages):
            task = request.messages[0].text
            calls = tuple(
                ToolCall(f"{name}_{abs(hash((task, index))) % 10**8}", name, args)
                for index, (name, args) in enumerate(self._calls)
            )
            return Reply(Message.assistant("", tool_calls=calls), Usage(requests=1))
        for word in self._answer.split(" "):
            if on_text is not None:
                on_text(word + " ")
            await anyio.sleep(self._latency / 10)
        return Reply(Message.assistant(self._answer), Usage(requests=1))


def build_agent(outbox: Path, latency: float = 0.05) -> Agent:
    """The desk agent, named "desk" (its mailer subagent inside); runs share it, keeping nothing."""

    @tool
    async def lookup(topic: str) -> str:
        """Look up what we know about a topic.

        Args:
            topic: What to look up.
        """
        await anyio.sleep(latency)
        return f"Notes on {topic}: the customer asked for an update."

    @tool
    def send_email(to: str, body: str) -> str:
        """Send an email.

        Args:
            to: The address.
            body: The text.
        """
        with outbox.open("a", encoding="utf-8") as out:
            out.write(f"{to}\t{body}\n")
        return f"sent to {to}"

    real = os.environ.get("OPENAI_API_KEY")
    mailer_model: Model | str = (
        "openai:gpt-4o-mini"
        if real
        else DemoModel(
            [("send_email", {"to": "customer@example.com", "body": "Your update is ready."})],
            "The mail is handled.",
            latency,
        )
    )
    mailer = Agent(
        mailer_model,
        name="mailer",
        description="Writes and sends an email for a task",
        tools=[send_email],
        permissions=[ApproveLater("send_email", reason="mail leaves the company")],
    )
    desk_model: Model | str = (
        "openai:gpt-4o-mini"
        if real
        else DemoModel(
            [("lookup", {"topic": "the customer"}), ("mailer", {"task": "Mail the customer."})],
            "Done: I looked up the notes and the customer is mailed.",
            latency,
        )
    )
    return Agent(desk_model, name="desk", tools=[lookup, mailer])
