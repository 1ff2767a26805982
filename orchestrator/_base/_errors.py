"""The library's exceptions, in one place.

The tree::

    OrchestratorError            base of every error the library raises on its own
    ├── OutputError              a structured answer stayed invalid after its retries
    ├── ValidationError          a document failed its collection's model (`.issues`)
    ├── ToolInputError           a model's tool-call arguments are wrong (`.issues`)
    ├── ProviderError            a model provider failed
    │   ├── RateLimitError       the provider asked us to slow down
    │   ├── AuthError            the key is missing or refused
    │   └── ContextTooLongError  the request does not fit the model's window
    ├── StoreError               a store's backend failed (its own error is the cause)
    │   ├── StoreDamagedError    stored data is damaged or forged (also a `ValueError`)
    │   └── StoreConflictError   a save does not continue the stored history (also a
    │                            `ValueError`): another writer, an older copy, another State
    ├── ChildRunError            a child run elsewhere failed or was lost (`.state_id`, `.state`)
    ├── CallAbandonedError       in a sync tool's thread: the call was cancelled or timed out
    ├── SubagentDepthError       a subagent would nest deeper than `max_subagent_depth`
    └── LimitReachedError        a `Limits` refused a request, a tool call or a child (`.stopped`)
    ToolError                    raised by tools: the model sees the message as an error result

Misuse of the API raises plain `TypeError` or `ValueError` with a message that says how to fix it;
a missing id raises a `LookupError` subclass of the standard library's.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

__all__ = (
    "AuthError",
    "CallAbandonedError",
    "ChildRunError",
    "ContextTooLongError",
    "Issue",
    "LimitReachedError",
    "OrchestratorError",
    "OutputError",
    "ProviderError",
    "RateLimitError",
    "StoreConflictError",
    "StoreDamagedError",
    "StoreError",
    "SubagentDepthError",
    "ToolError",
    "ValidationError",
    "error_text",
    "is_interruption",
)


class OrchestratorError(Exception):
    """Base class of the errors the library raises on its own."""


class ChildRunError(OrchestratorError):
    """A child run that a runner sent elsewhere failed, or its worker was lost.

    `state_id` names the child; `state` is the child as stored (its open calls closed), when
    it could be loaded, so its usage still rolls up to the parent.
    """

    def __init__(self, message: str, *, state_id: str, state: Any = None) -> None:
        super().__init__(message)
        self.state_id = state_id
        self.state = state


class OutputError(OrchestratorError):
    """The model's structured answer was still invalid after every retry."""


@dataclass(frozen=True, slots=True)
class Issue:
    """One validation problem: where it is (`path`) and what is wrong (`message`)."""

    path: tuple[str | int, ...]
    message: str

    def __str__(self) -> str:
        where = ".".join(str(part) for part in self.path) or "(document)"
        return f"{where}: {self.message}"


class ValidationError(OrchestratorError, ValueError):
    """A value failed validation; `issues` lists each problem with its path."""

    def __init__(self, message: str, issues: tuple[Issue, ...] = ()) -> None:
        super().__init__(message)
        self.issues = issues


class ProviderError(OrchestratorError):
    """A model provider failed to answer."""


class RateLimitError(ProviderError):
    """The provider refused the request for now; retry later."""


class AuthError(ProviderError):
    """The provider refused the credentials, or none were given."""


class ContextTooLongError(ProviderError):
    """The request is longer than the model's context window."""


class StoreError(OrchestratorError):
    """A store's backend failed: the disk, the database or its connection.

    The backend's own exception is chained as the cause (``raise ... from error``), and the
    message names the store and, where one is concerned, the State.
    """


class StoreDamagedError(StoreError, ValueError):
    """What a store holds is damaged or was changed behind its back.

    A damaged file, an entry whose integrity check fails, a missing or extra entry, a row that
    cannot be read: the message names the store, the State and where the damage is, and says
    what to do (restore from a backup, or delete the State). It is a `ValueError` too.
    """


class StoreConflictError(StoreError, ValueError):
    """A save was refused: the State does not continue the history stored under its id.

    Another writer saved it meanwhile, it is an older copy, or it is another State under a
    taken id. Nothing was written; the message names the State and says how to go on: load the
    stored one and continue it, or save this one under a new id (`state.fork()`).
    """


class CallAbandonedError(OrchestratorError):
    """Raised in a sync tool's thread whose call was abandoned: cancelled, or timed out.

    A thread cannot be stopped, so the run stops waiting for it: the call is recorded
    (``interrupted``, or its timeout error), the run goes on or returns, and the thread's late
    result is dropped. From then on the thread may not run an agent nor change a State: both
    raise this error in it, and the tool should return.
    """


class SubagentDepthError(OrchestratorError):
    """A subagent was refused: it would nest deeper than its agent's `max_subagent_depth`.

    Raised where the subagent is started (in the tool call): the call gets an error result
    naming the setting, and the run goes on.
    """


class LimitReachedError(OrchestratorError):
    """A `Limits` above a run refused what it was about to do: `stopped` says which and whose.

    A subagent refused by its parent's ``children`` or ``depth`` limit raises it where it is
    started, so the tool call gets an error result. ``agent.athink(state)`` raises it when the
    run has nothing left to spend; the default loop checks first and stops cleanly instead.
    """

    def __init__(self, stopped: Any) -> None:
        super().__init__(str(stopped))
        self.stopped = stopped


class ToolError(Exception):
    """Raise it in a tool to give the model an error result it can act on.

    It is not an `OrchestratorError`: the library never raises it, tools do.
    """


def is_interruption(error: BaseException) -> bool:
    """Whether `error` is a cancellation (asyncio or trio) or Ctrl+C, also outside a loop."""
    if isinstance(error, asyncio.CancelledError | KeyboardInterrupt):
        return True
    trio: Any = sys.modules.get("trio")
    return trio is not None and isinstance(error, trio.Cancelled)


def error_text(error: BaseException) -> str:
    """How an exception is recorded: ``"TypeName: message"``."""
    if is_interruption(error):
        return f"{type(error).__name__}: interrupted"
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
