"""Permissions: which tool calls an agent may run.

An agent with ``permissions=None`` runs every call. With a list, each call is decided before it
runs: every permission with ``deny_first=True`` is asked first, in list order, then the others in
list order, and the first one with an opinion (`Allowed` or `Denied`) decides. A call no
permission decides is denied: the list fails closed.

A `Denied` decision becomes an error result the model reads. ``Denied(reason, stop=True)`` also
cancels the turn's other calls and stops the run with `StoppedByPermission(call, permission)`.
A `Deferred` decision leaves the call to a person: the turn's other calls run, then the run stops
with `StoppedByApproval` and the State is saved; `orchestrator.approve` / `orchestrator.deny`
record the person's decision (in any process), and the next run carries it out.
"""

from __future__ import annotations

import fnmatch
import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from .._base._messages import ToolCall
from .._base._sync import is_async_callable
from .._record._state import State

__all__ = (
    "AllowByName",
    "AllowByReadOnly",
    "Allowed",
    "ApprovalCallback",
    "ApproveLater",
    "AskApproval",
    "Decision",
    "Deferred",
    "Denied",
    "DenyByName",
    "Permission",
    "check_permissions",
    "decide",
    "terminal_lock",
)

DECLINED = "the user declined"

_EXAMPLE = "permissions=[DenyByName('delete_*'), AllowByName('read_*')]"


@dataclass(frozen=True, slots=True)
class Allowed:
    """The call may run."""

    kind: Literal["allowed"] = field(default="allowed", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class Denied:
    """The call may not run; the model reads `reason` as the call's error result.

    With ``stop=True`` the turn's other calls are cancelled too and the run stops with
    `StoppedByPermission`.
    """

    reason: str
    stop: bool = False
    kind: Literal["denied"] = field(default="denied", init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str):
            raise TypeError(
                f"Denied.reason must be a str the model can read, got {type(self.reason).__name__}."
            )
        if not self.reason.strip():
            raise ValueError(
                "Denied.reason is empty: say why the call is denied, e.g."
                " Denied('writing files is not allowed here')."
            )
        if not isinstance(self.stop, bool):
            raise TypeError(f"Denied.stop must be a bool, got {type(self.stop).__name__}.")


@dataclass(frozen=True, slots=True)
class Deferred:
    """A person decides the call later: the run stops with `StoppedByApproval` until then.

    `reason` (optional) tells the person why they are asked.
    """

    reason: str | None = None
    kind: Literal["deferred"] = field(default="deferred", init=False, repr=False)

    def __post_init__(self) -> None:
        if self.reason is not None and not isinstance(self.reason, str):
            raise TypeError(f"Deferred.reason must be a str, got {type(self.reason).__name__}.")


Decision: TypeAlias = Allowed | Denied | Deferred
"""What a permission decides about one call."""


class Permission(ABC):
    """A rule that decides tool calls: subclass it and write `check`.

    `check` returns `Allowed()`, `Denied(reason)` or None when the rule has no opinion. Set the
    class attribute ``deny_first = True`` on a rule that only denies, so it is asked before the
    rules that allow. `name` (the class name unless set) names the rule in `StoppedByPermission`
    and in logs.

    Example:
        ```python
        class NoWritesOnMain(Permission):
            deny_first = True

            async def check(self, call, tool, state):
                if call.name.startswith("write_") and state.extra_data.get("branch") == "main":
                    return Denied("writes are not allowed on main")
                return None
        ```
    """

    name: str = "Permission"
    deny_first: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    @abstractmethod
    async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
        """Decide `call`: `Allowed()`, `Denied(reason)`, or None for no opinion.

        Args:
            call: The tool call the model requested.
            tool: The agent's tool of that name, or None when the agent has none.
            state: The State the call belongs to (read it; do not change it here).
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _patterns(owner: str, value: object) -> tuple[str, ...]:
    """Return `value` as a tuple of fnmatch globs, or raise saying how to pass them."""
    example = f"{owner}('read_*') or {owner}(['read_*', 'list_*'])"
    kind = type(value).__name__
    if isinstance(value, str):
        items: tuple[object, ...] = (value,)
    elif isinstance(value, Iterable) and not isinstance(value, bytes | bytearray | Mapping):
        items = tuple(cast("Iterable[object]", value))
    else:
        raise TypeError(
            f"{owner} takes a tool name pattern or a list of them, got {kind}: use {example}."
        )
    if not items:
        raise ValueError(f"{owner} got no patterns, so it would match no tool: use {example}.")
    for item in items:
        if not isinstance(item, str):
            raise TypeError(
                f"{owner} patterns are str globs on tool names, got {type(item).__name__}"
                f" {item!r}: use {example}."
            )
        if not item:
            raise ValueError(
                f"{owner} got an empty pattern, which matches no tool: use '*' for every tool"
                f" or a glob such as 'read_*'."
            )
    return cast("tuple[str, ...]", items)


def _matches(patterns: tuple[str, ...], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


class AllowByName(Permission):
    """Allow the tools whose name matches one of `patterns`; no opinion on the others.

    Patterns are case-sensitive fnmatch globs: ``*`` matches anything, ``?`` one character,
    ``[abc]`` one of a set. A single string is one pattern.

    Example:
        ```python
        Agent(model, tools=tools, permissions=[AllowByName(["read_*", "search"])])
        ```

    Raises:
        TypeError: `patterns` is not a str or a list of str.
        ValueError: `patterns` is empty or holds an empty string.
    """

    __slots__ = ("_patterns", "name")

    def __init__(self, patterns: Iterable[str] | str) -> None:
        self._patterns = _patterns("AllowByName", patterns)
        self.name: str = repr(self)

    @property
    def patterns(self) -> tuple[str, ...]:
        """The globs, in the order given."""
        return self._patterns

    async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
        """Allow `call` when its tool name matches a pattern."""
        await anyio.lowlevel.checkpoint()
        return Allowed() if _matches(self._patterns, call.name) else None

    def __repr__(self) -> str:
        return f"AllowByName({list(self._patterns)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AllowByName) and other._patterns == self._patterns

    def __hash__(self) -> int:
        return hash(("AllowByName", self._patterns))


class DenyByName(Permission):
    """Deny the tools whose name matches one of `patterns`; no opinion on the others.

    It is a deny rule (``deny_first = True``): it is asked before every rule that allows, wherever
    it stands in the list. `reason` is what the model reads (a default names the rule); with
    ``stop=True`` a denied call also stops the run.

    Example:
        ```python
        permissions = [AllowByName("*"), DenyByName("shell", reason="no shell here", stop=True)]
        ```

    Raises:
        TypeError: `patterns` is not a str or a list of str, `reason` is not a str, or `stop` is
            not a bool.
        ValueError: `patterns` is empty or holds an empty string, or `reason` is blank.
    """

    __slots__ = ("_patterns", "_reason", "_stop", "name")

    deny_first = True

    def __init__(
        self, patterns: Iterable[str] | str, *, reason: str | None = None, stop: bool = False
    ) -> None:
        self._patterns = _patterns("DenyByName", patterns)
        if reason is not None:
            Denied(reason)  # the same checks as the decision it becomes
        if not isinstance(stop, bool):
            raise TypeError(f"DenyByName(stop=...) must be a bool, got {type(stop).__name__}.")
        self._reason = reason
        self._stop = stop
        self.name: str = repr(self)

    @property
    def patterns(self) -> tuple[str, ...]:
        """The globs, in the order given."""
        return self._patterns

    @property
    def reason(self) -> str | None:
        """The reason given, or None for the default one."""
        return self._reason

    @property
    def stop(self) -> bool:
        """Whether a denied call stops the run."""
        return self._stop

    async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
        """Deny `call` when its tool name matches a pattern."""
        await anyio.lowlevel.checkpoint()
        if not _matches(self._patterns, call.name):
            return None
        reason = self._reason or f"the tool {call.name!r} is denied by {self!r}"
        return Denied(reason, stop=self._stop)

    def __repr__(self) -> str:
        extra = ""
        if self._reason is not None:
            extra += f", reason={self._reason!r}"
        if self._stop:
            extra += ", stop=True"
        return f"DenyByName({list(self._patterns)!r}{extra})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DenyByName) and (
            other._patterns,
            other._reason,
            other._stop,
        ) == (self._patterns, self._reason, self._stop)

    def __hash__(self) -> int:
        return hash(("DenyByName", self._patterns, self._reason, self._stop))


class AllowByReadOnly(Permission):
    """Allow the tools marked read-only (``tool.read_only is True``); no opinion on the others.

    A call to a tool the agent does not have (``tool`` is None) gets no opinion.
    """

    __slots__ = ()

    async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
        """Allow `call` when its tool has ``read_only = True``."""
        await anyio.lowlevel.checkpoint()
        return Allowed() if getattr(tool, "read_only", None) is True else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AllowByReadOnly)

    def __hash__(self) -> int:
        return hash("AllowByReadOnly")


ApprovalCallback: TypeAlias = (
    Callable[[ToolCall, State], Awaitable[bool | Decision]]
    | Callable[[ToolCall, State], bool | Decision]
)
"""What `AskApproval` calls: ``(call, state)`` to True, False, `Allowed()` or `Denied(...)`."""

# One lock per event loop: the terminal is shared by every AskApproval, and a lock made for one
# event loop must not be used by another (each sync `agent.run` starts its own).
_TERMINAL_LOCK: anyio.lowlevel.RunVar[anyio.Lock] = anyio.lowlevel.RunVar(
    "orchestrator.permissions.terminal_lock"
)


def terminal_lock() -> anyio.Lock:
    """The lock of the terminal prompts on the current event loop: one question at a time."""
    lock = _TERMINAL_LOCK.get(None)
    if lock is None:
        lock = anyio.Lock()
        _TERMINAL_LOCK.set(lock)
    return lock


def _read_answer(prompt: str) -> str | None:
    """Ask `prompt` on the terminal (in a worker thread); None at the end of input."""
    try:
        return input(prompt)
    except EOFError:
        return None


def _call_boxed(callback: Callable[..., object], *args: object) -> tuple[object]:
    """Call `callback` in a worker thread; the box lets a returned coroutine reach the loop."""
    return (callback(*args),)


def _describe_callable(value: object) -> str:
    qualname = getattr(value, "__qualname__", None)
    return qualname if isinstance(qualname, str) else type(value).__name__


class AskApproval(Permission):
    """Ask someone whether each call may run: a callback you give, or the terminal.

    `callback(call, state)` returns True, False, `Allowed()` or `Denied(...)`. An ``async def``
    callback is awaited (a web app awaits its user's answer there); a plain function runs in a
    worker thread. False is ``Denied("the user declined", stop=deny_stop)``.

    Without a callback it asks on the terminal, ``Allow tool name({...})? [y/N]``, one prompt at a
    time: ``y`` or ``yes`` allows, anything else (or the end of input) declines. This is the only
    place the library uses the terminal. A run cancelled while the prompt waits ends at once; the
    prompt's pending read then takes the next line typed, which counts for nothing.

    It decides every call it is asked about, so put it after the rules that allow safe calls
    without asking: ``[AllowByReadOnly(), AskApproval()]``.

    Example:
        ```python
        async def approve(call: ToolCall, state: State) -> bool:
            return await ui.confirm(f"Run {call.name}?")

        agent = Agent(model, tools=tools, permissions=[AllowByReadOnly(), AskApproval(approve)])
        ```

    Raises:
        TypeError: `callback` is not callable, or `deny_stop` is not a bool. When deciding: the
            callback returned something other than a bool, `Allowed` or `Denied`.
    """

    __slots__ = ("_callback", "_deny_stop", "_is_async", "name")

    def __init__(
        self, callback: ApprovalCallback | None = None, *, deny_stop: bool = False
    ) -> None:
        if callback is not None and not callable(callback):
            raise TypeError(
                f"AskApproval(callback) takes a function (call, state) -> bool, got"
                f" {type(callback).__name__}: pass `async def approve(call, state): ...`, or no"
                " callback to ask on the terminal."
            )
        if not isinstance(deny_stop, bool):
            raise TypeError(
                f"AskApproval(deny_stop=...) must be a bool, got {type(deny_stop).__name__}."
            )
        self._callback = callback
        self._deny_stop = deny_stop
        self._is_async = is_async_callable(callback)
        self.name: str = repr(self)

    @property
    def callback(self) -> ApprovalCallback | None:
        """The callback, or None when it asks on the terminal."""
        return self._callback

    @property
    def deny_stop(self) -> bool:
        """Whether a declined call stops the run."""
        return self._deny_stop

    async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
        """Ask about `call` and return the answer as a decision.

        Raises:
            TypeError: The callback returned something other than a bool, `Allowed` or `Denied`.
        """
        callback = self._callback
        if callback is None:
            return await self._ask_terminal(call)
        if self._is_async:
            answer: object = await cast("Callable[[ToolCall, State], Awaitable[object]]", callback)(
                call, state
            )
        else:
            (answer,) = await anyio.to_thread.run_sync(_call_boxed, callback, call, state)
            if inspect.isawaitable(answer):
                # A plain function (a lambda, a partial) that returned a coroutine.
                answer = await cast("Awaitable[object]", answer)
        if isinstance(answer, bool):
            return Allowed() if answer else Denied(DECLINED, stop=self._deny_stop)
        if isinstance(answer, Allowed | Denied):
            return answer
        raise TypeError(
            f"The approval callback {_describe_callable(callback)} of {self!r} returned"
            f" {type(answer).__name__} {answer!r} for the call {call.name} ({call.id}): return"
            " True, False, Allowed() or Denied(reason)."
        )

    async def _ask_terminal(self, call: ToolCall) -> Decision:
        arguments = json.dumps(call.args, ensure_ascii=False)
        prompt = f"Allow tool {call.name}({arguments})? [y/N] "
        async with terminal_lock():
            # Abandoned on cancel: input() cannot be interrupted, and a run must stop at once.
            answer = await anyio.to_thread.run_sync(_read_answer, prompt, abandon_on_cancel=True)
        if answer is not None and answer.strip().lower() in ("y", "yes"):
            return Allowed()
        return Denied(DECLINED, stop=self._deny_stop)

    def __repr__(self) -> str:
        parts: list[str] = []
        if self._callback is not None:
            parts.append(_describe_callable(self._callback))
        if self._deny_stop:
            parts.append("deny_stop=True")
        return f"AskApproval({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AskApproval) and (
            other._callback == self._callback and other._deny_stop == self._deny_stop
        )

    def __hash__(self) -> int:
        return hash(("AskApproval", self._deny_stop))


class ApproveLater(Permission):
    """Leave the calls to tools matching `patterns` to a person, who decides later.

    The run does not wait in memory: it stops with `StoppedByApproval` once the turn's other
    calls are done, and the State is saved. Someone then records a decision with
    `orchestrator.approve` or `orchestrator.deny` (any process, any time) and runs the State
    again. Put it after the rules that allow safe calls: ``[AllowByReadOnly(), ApproveLater()]``.

    Example:
        ```python
        agent = Agent(model, tools=tools, store=store, permissions=[ApproveLater("send_*")])
        ```

    Raises:
        TypeError: `patterns` is not a str or a list of str, or `reason` is not a str.
        ValueError: `patterns` is empty or holds an empty string.
    """

    __slots__ = ("_patterns", "_reason", "name")

    def __init__(self, patterns: Iterable[str] | str = "*", *, reason: str | None = None) -> None:
        self._patterns = _patterns("ApproveLater", patterns)
        Deferred(reason)  # the same checks as the decision it becomes
        self._reason = reason
        self.name: str = repr(self)

    @property
    def patterns(self) -> tuple[str, ...]:
        """The globs, in the order given."""
        return self._patterns

    async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
        """Defer `call` to a person when its tool name matches a pattern."""
        await anyio.lowlevel.checkpoint()
        return Deferred(self._reason) if _matches(self._patterns, call.name) else None

    def __repr__(self) -> str:
        extra = "" if self._reason is None else f", reason={self._reason!r}"
        return f"ApproveLater({list(self._patterns)!r}{extra})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApproveLater) and (other._patterns, other._reason) == (
            self._patterns,
            self._reason,
        )

    def __hash__(self) -> int:
        return hash(("ApproveLater", self._patterns, self._reason))


def _ordered(permissions: Sequence[Permission]) -> list[Permission]:
    first = [permission for permission in permissions if permission.deny_first]
    return first + [permission for permission in permissions if not permission.deny_first]


async def decide(
    permissions: Sequence[Permission] | None, call: ToolCall, tool: Any | None, state: State
) -> tuple[Decision, str | None]:
    """Decide `call` and name the permission that decided it.

    With `permissions` None every call is allowed (no permission system). Otherwise the deny
    rules (``deny_first``) are asked first, then the others, each group in list order; the first
    decision wins. When nobody decides, the call is denied: permissions fail closed.

    Args:
        permissions: The agent's permissions, checked by `check_permissions`, or None.
        call: The call to decide.
        tool: The agent's tool named ``call.name``, or None when it has none.
        state: The State the call belongs to.

    Returns:
        The decision and the `name` of the permission that made it (None when no permission did).

    Raises:
        TypeError: A permission returned something other than `Allowed`, `Denied` or None.
    """
    await anyio.lowlevel.checkpoint()
    if permissions is None:
        return Allowed(), None
    for permission in _ordered(permissions):
        decision: object = await permission.check(call, tool, state)
        if decision is None:
            continue
        if not isinstance(decision, Allowed | Denied | Deferred):
            raise TypeError(
                f"The permission {permission.name} returned {type(decision).__name__}"
                f" {decision!r} for the call {call.name} ({call.id}): check() returns Allowed(),"
                " Denied(reason), Deferred() or None (no opinion)."
            )
        return decision, permission.name
    return (
        Denied(
            f"no permission allows the tool {call.name!r}: add AllowByName([{call.name!r}])"
            " (or another permission that allows it) to the agent's permissions"
        ),
        None,
    )


def _bad_item(item: object, index: int) -> TypeError:
    where = f"permissions[{index}]"
    kind = type(item).__name__
    function = _describe_callable(item) if callable(item) else None
    if isinstance(item, type) and issubclass(item, Permission):
        return TypeError(
            f"{where} is the class {item.__name__}, not a permission: create one, e.g."
            f" {item.__name__}(...)."
        )
    if isinstance(item, str):
        return TypeError(
            f"{where} is the str {item!r}, not a permission: use AllowByName({item!r}) or"
            f" DenyByName({item!r})."
        )
    if function is not None:
        return TypeError(
            f"{where} is {function}, a function, not a permission: subclass"
            " Permission and write `async def check(self, call, tool, state)`, or wrap an approval"
            " function in AskApproval(function)."
        )
    return TypeError(
        f"{where} is a {kind}, not a permission: use Permission objects, e.g. {_EXAMPLE}."
    )


def check_permissions(value: object) -> tuple[Permission, ...] | None:
    """Check an ``Agent(permissions=...)`` value and return it as a tuple (None stays None).

    None means no permission system: every call runs. A list is asked in the order `decide`
    says; an empty list denies every call.

    Raises:
        TypeError: `value` is not None or an ordered collection (a list or tuple) of `Permission`
            objects, or a permission has a `check` that is not ``async def`` or a `name` that is
            not a non-empty str.
    """
    if value is None:
        return None
    kind = type(value).__name__
    if isinstance(value, Permission):
        raise TypeError(
            f"permissions takes a list of permissions, got a single {value!r}: use"
            f" permissions=[{value!r}]."
        )
    if isinstance(value, str | bytes):
        raise TypeError(
            f"permissions takes a list of Permission objects, got the {kind}"
            f" {value!r}: use permissions=[AllowByName({value!r})] to allow tools by name."
        )
    if isinstance(value, Set | Mapping):
        raise TypeError(
            f"permissions takes a list, got a {kind}: the order of the rules"
            f" matters, so use a list, e.g. {_EXAMPLE}."
        )
    if not isinstance(value, Iterable):
        raise TypeError(
            f"permissions takes a list of Permission objects, got {kind}:"
            f" e.g. {_EXAMPLE}, or None to run every call."
        )
    items = tuple(cast("Iterable[object]", value))
    for index, item in enumerate(items):
        if not isinstance(item, Permission):
            raise _bad_item(item, index)
        if not inspect.iscoroutinefunction(item.check):
            raise TypeError(
                f"{type(item).__name__}.check must be `async def check(self, call, tool, state)`:"
                " the loop awaits it."
            )
        if not isinstance(item.name, str) or not item.name:
            raise TypeError(
                f"permissions[{index}] ({type(item).__name__}) has the name {item.name!r}: a"
                " permission's name is a non-empty str (the class name unless you set it)."
            )
    return cast("tuple[Permission, ...]", items)
