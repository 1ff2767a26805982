"""`Link`: the place of a child run, as a value that can travel to another process.

A subagent's State hangs under the tool call that started it. In one process the run finds
that call through the current frame; a child run somewhere else (a runner's worker) gets it as
a `Link` and runs ``await agent.arun(state, link=link)``: the same `run_start` links, and the
same effect keys for its memory writes, as a child run in the parent's process.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("Link", "child_scope")


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """Where a child run hangs: the parent State, its tool call, and the child's place.

    `scope` keys the child's memory writes (their effect keys start with it), so a child
    that runs again, or on another machine, writes each effect once. A runner gets links from
    the library (a `ChildJob`); you make one yourself only to rebuild a job.

    Attributes:
        parent_id: The id of the State whose tool call started the child.
        call_id: The id of that tool call.
        scope: The child's place in the call: the prefix of its memory effect keys.
    """

    parent_id: str
    call_id: str
    scope: str

    def __post_init__(self) -> None:
        for name in ("parent_id", "call_id", "scope"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Link.{name} must be a non-empty str, got {value!r}.")


def child_scope(scope: str, turn: int, call_id: str, index: int) -> str:
    """The scope of the child number `index` of call `call_id`, in turn `turn` of a State.

    `scope` is the parent's own: its id, or its scope when it is a child itself.
    """
    return f"{scope}:{turn}:{call_id}/{index}"
