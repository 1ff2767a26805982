"""Subagents: an Agent used as a tool, and the context that links child States to a call.

A tool call links every new State that an agent runs while the call executes (from an async
tool, or from a sync tool in a worker thread: the current frame, `orchestrator._frame`, follows
both). The link is
recorded in the child's first `run_start` (`parent_id`, `parent_call_id`); the parent's
`tool_result` lists the `child_ids` and adds their usage when the call closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import ToolError, error_text, is_interruption
from ._frame import current_frame
from ._messages import Message
from ._state import State
from ._tools import Tool

if TYPE_CHECKING:
    from ._agent import Agent

__all__ = ("AgentTool",)


class AgentTool(Tool):
    """An agent as a tool: the model passes a task and a new child State runs it.

    The child's answer is the result (a structured answer comes back as JSON). A child that
    fails gives the model an error result it can act on; a cancellation is re-raised. A child
    that stopped for a person's decision (`StoppedByApproval`) is continued, not started again,
    when its parent's call runs after the decision.
    """

    def __init__(self, agent: Agent, *, name: str | None = None, description: str | None = None):
        name = name or agent.name
        description = description or agent.description
        if not name or not description:
            raise ValueError(
                "An agent used as a tool needs a name and a description: Agent(...,"
                " name='coder', description='Writes and fixes code'), or"
                " agent.as_tool(name=..., description=...)."
            )
        super().__init__(name=name, description=description)
        self.agent = agent

    async def arun(self, task: str) -> Any:
        """Run the subagent on a new State.

        Args:
            task: The whole task for the subagent: it sees only this message.
        """
        frame = current_frame()
        resume = frame.call.resume if frame is not None and frame.call is not None else None
        state = resume if resume is not None else State(messages=[Message.user(task)])
        try:
            return await self.agent.arun(state)
        except Exception as error:
            if is_interruption(error):
                raise
            raise ToolError(f"The subagent {self.name!r} failed: {error_text(error)}") from error
