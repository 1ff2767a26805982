"""Permissions: decisions, ordering, the built-in rules, approval prompts and validation."""

from __future__ import annotations

import builtins
import functools
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import pytest

import orchestrator.permissions

# Private: the terminal prompt's module and lock, to fake the terminal and see prompts queue.
from orchestrator import State, ToolCall
from orchestrator._tooling import _permissions
from orchestrator._tooling._permissions import terminal_lock
from orchestrator.permissions import (
    AllowByName,
    AllowByReadOnly,
    Allowed,
    AskApproval,
    Decision,
    Denied,
    DenyByName,
    Permission,
    check_permissions,
    decide,
)
from tests.doubles import as_any

pytestmark = pytest.mark.anyio


def _call(name: str = "read_file", call_id: str = "c1", **args: Any) -> ToolCall:
    return ToolCall(call_id, name, args)


class _Tool:
    def __init__(self, **attributes: object) -> None:
        self.__dict__.update(attributes)


class _Fixed(Permission):
    """Returns a fixed decision and records that it was asked."""

    def __init__(self, decision: Decision | None, log: list[str], label: str) -> None:
        self.decision = decision
        self.log = log
        self.name = label

    async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
        self.log.append(self.name)
        return self.decision


class _FixedDenyFirst(_Fixed):
    deny_first = True


# -- decide: None, fail closed, order -----------------------------------------------------------


async def test_no_permissions_allow_every_call() -> None:
    assert await decide(None, _call("rm_rf"), None, State()) == (Allowed(), None)


async def test_empty_list_fails_closed() -> None:
    decision, name = await decide([], _call("rm_rf"), None, State())
    assert name is None
    assert isinstance(decision, Denied)
    assert not decision.stop
    assert "no permission allows the tool 'rm_rf'" in decision.reason
    assert "AllowByName(['rm_rf'])" in decision.reason


async def test_nobody_deciding_fails_closed() -> None:
    permissions = [AllowByName("read_*"), DenyByName("write_*"), AllowByReadOnly()]
    decision, name = await decide(permissions, _call("search"), _Tool(), State())
    assert name is None
    assert isinstance(decision, Denied)
    assert "'search'" in decision.reason


async def test_deny_rules_are_asked_first_even_when_listed_last() -> None:
    permissions = [AllowByName("*"), DenyByName("delete_*")]
    decision, name = await decide(permissions, _call("delete_user"), None, State())
    assert decision == Denied("the tool 'delete_user' is denied by DenyByName(['delete_*'])")
    assert name == "DenyByName(['delete_*'])"
    # A call the deny rule does not match falls through to the allow rule.
    assert await decide(permissions, _call("read_user"), None, State()) == (
        Allowed(),
        "AllowByName(['*'])",
    )


async def test_order_of_the_other_rules_decides_and_stops_at_the_first_decision() -> None:
    log: list[str] = []
    allow = _Fixed(Allowed(), log, "allow")
    deny = _Fixed(Denied("nope"), log, "deny")
    silent = _Fixed(None, log, "silent")

    assert await decide([silent, allow, deny], _call(), None, State()) == (Allowed(), "allow")
    assert log == ["silent", "allow"]

    log.clear()
    assert await decide([silent, deny, allow], _call(), None, State()) == (Denied("nope"), "deny")
    assert log == ["silent", "deny"]


async def test_deny_first_rules_keep_their_list_order_before_the_others() -> None:
    log: list[str] = []
    permissions = [
        _Fixed(None, log, "a"),
        _FixedDenyFirst(None, log, "first"),
        _Fixed(None, log, "b"),
        _FixedDenyFirst(Denied("second says no"), log, "second"),
    ]
    assert await decide(permissions, _call(), None, State()) == (
        Denied("second says no"),
        "second",
    )
    assert log == ["first", "second"]

    log.clear()
    permissions[3] = _FixedDenyFirst(None, log, "second")
    decision, name = await decide(permissions, _call(), None, State())
    assert name is None
    assert isinstance(decision, Denied)
    assert log == ["first", "second", "a", "b"]


async def test_a_stop_denial_passes_through_with_its_permission_name() -> None:
    log: list[str] = []
    stopper = _FixedDenyFirst(Denied("dangerous", stop=True), log, "guard")
    decision, name = await decide([AllowByName("*"), stopper], _call(), None, State())
    assert decision == Denied("dangerous", stop=True)
    assert name == "guard"

    rule = DenyByName("shell", reason="no shell here", stop=True)
    assert await decide([rule], _call("shell"), None, State()) == (
        Denied("no shell here", stop=True),
        "DenyByName(['shell'], reason='no shell here', stop=True)",
    )


async def test_a_permission_returning_a_wrong_value_raises_type_error() -> None:
    class Sloppy(Permission):
        async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
            return as_any(True)

    with pytest.raises(TypeError, match=r"The permission Sloppy returned bool True .*read_file"):
        await decide([Sloppy()], _call(), None, State())


async def test_decide_is_a_cancellation_point() -> None:
    reached = False
    with anyio.CancelScope() as scope:
        scope.cancel()
        await decide(None, _call(), None, State())
        reached = True
    assert not reached


# -- built-in rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "name", "allowed"),
    [
        ("read_*", "read_file", True),
        ("read_*", "write_file", False),
        ("read_*", "READ_file", False),  # case-sensitive
        ("read_?", "read_a", True),
        ("read_?", "read_ab", False),
        ("[ab]_tool", "b_tool", True),
        ("[ab]_tool", "c_tool", False),
        ("search", "search", True),
        ("search", "search2", False),
        ("ab", "a", False),  # a str is one pattern, not one per character
        (["read_*", "search"], "search", True),
        (("read_*", "search"), "list", False),
        ("*", "anything", True),
    ],
)
async def test_allow_by_name_matches_fnmatch_globs(
    patterns: str | list[str] | tuple[str, ...], name: str, allowed: bool
) -> None:
    decision = await AllowByName(patterns).check(_call(name), None, State())
    assert decision == (Allowed() if allowed else None)


async def test_deny_by_name_matches_globs_and_has_no_opinion_otherwise() -> None:
    rule = DenyByName(["delete_*", "drop_?"])
    assert rule.deny_first
    assert not AllowByName("x").deny_first
    assert await rule.check(_call("drop_x"), None, State()) == Denied(
        "the tool 'drop_x' is denied by DenyByName(['delete_*', 'drop_?'])"
    )
    assert await rule.check(_call("drop_xy"), None, State()) is None
    assert await DenyByName("x", reason="r").check(_call("x"), None, State()) == Denied("r")


async def test_allow_by_read_only_needs_read_only_true() -> None:
    rule = AllowByReadOnly()
    state = State()
    assert await rule.check(_call(), _Tool(read_only=True), state) == Allowed()
    assert await rule.check(_call(), _Tool(read_only=False), state) is None
    assert await rule.check(_call(), _Tool(), state) is None
    assert await rule.check(_call(), _Tool(read_only="yes"), state) is None
    assert await rule.check(_call(), None, state) is None


async def test_allow_by_read_only_in_decide() -> None:
    permissions = [AllowByReadOnly(), DenyByName("*", reason="only reads")]
    # The deny rule comes first, whatever the tool says.
    assert await decide(permissions, _call(), _Tool(read_only=True), State()) == (
        Denied("only reads"),
        "DenyByName(['*'], reason='only reads')",
    )
    assert await decide([AllowByReadOnly()], _call(), _Tool(read_only=True), State()) == (
        Allowed(),
        "AllowByReadOnly",
    )


async def test_custom_permission_gets_call_tool_and_state() -> None:
    seen: list[tuple[ToolCall, object, State]] = []

    class OnlyOnMain(Permission):
        async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
            seen.append((call, tool, state))
            if state.extra_data.get("branch") != "main":
                return Denied(f"{call.name} runs on main only")
            return None

    call, tool, state = _call("deploy"), _Tool(), State(extra_data={"branch": "dev"})
    rule = OnlyOnMain()
    assert rule.name == "OnlyOnMain"
    assert repr(rule) == "OnlyOnMain()"
    assert await decide([rule], call, tool, state) == (
        Denied("deploy runs on main only"),
        "OnlyOnMain",
    )
    assert seen == [(call, tool, state)]


def test_permission_name_and_deny_first_can_be_set_on_the_class() -> None:
    class Guard(Permission):
        name = "the guard"
        deny_first = True

        async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
            return None

    assert Guard().name == "the guard"
    assert Guard().deny_first
    assert check_permissions([Guard()]) is not None


def test_permission_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        as_any(Permission)()


# -- AskApproval with a callback ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (True, Allowed()),
        (False, Denied("the user declined")),
        (Allowed(), Allowed()),
        (Denied("not now", stop=True), Denied("not now", stop=True)),
    ],
)
async def test_ask_approval_awaits_an_async_callback(
    answer: bool | Decision, expected: Decision
) -> None:
    asked: list[tuple[ToolCall, State]] = []

    async def approve(call: ToolCall, state: State) -> bool | Decision:
        asked.append((call, state))
        return answer

    call, state = _call("write_file", path="a.txt"), State()
    assert await decide([AskApproval(approve)], call, None, state) == (
        expected,
        "AskApproval(test_ask_approval_awaits_an_async_callback.<locals>.approve)",
    )
    assert asked == [(call, state)]


async def test_ask_approval_deny_stop_applies_to_a_false_answer() -> None:
    async def refuse(call: ToolCall, state: State) -> bool:
        return False

    rule = AskApproval(refuse, deny_stop=True)
    assert await rule.check(_call(), None, State()) == Denied("the user declined", stop=True)


async def test_ask_approval_runs_a_sync_callback_in_a_worker_thread() -> None:
    threads: list[int] = []

    def approve(call: ToolCall, state: State) -> bool:
        threads.append(threading.get_ident())
        return call.name == "read_file"

    rule = AskApproval(approve)
    assert await rule.check(_call("read_file"), None, State()) == Allowed()
    assert await rule.check(_call("write_file"), None, State()) == Denied("the user declined")
    assert len(threads) == 2
    assert threading.get_ident() not in threads


async def test_ask_approval_awaits_what_a_plain_function_returns() -> None:
    async def approve(call: ToolCall, state: State, *, allow: bool) -> bool:
        return allow

    by_lambda = AskApproval(lambda call, state: approve(call, state, allow=True))
    assert await by_lambda.check(_call(), None, State()) == Allowed()
    by_partial = AskApproval(functools.partial(approve, allow=False))
    assert await by_partial.check(_call(), None, State()) == Denied("the user declined")


async def test_ask_approval_awaits_an_object_with_async_call() -> None:
    class Approver:
        def __init__(self) -> None:
            self.thread: int | None = None

        async def __call__(self, call: ToolCall, state: State) -> bool:
            self.thread = threading.get_ident()
            return True

    approver = Approver()
    assert await AskApproval(approver).check(_call(), None, State()) == Allowed()
    assert approver.thread == threading.get_ident()  # awaited on the event loop, no thread


@pytest.mark.parametrize("answer", [None, "yes", 1, Denied])
async def test_ask_approval_rejects_a_wrong_callback_answer(answer: object) -> None:
    async def approve(call: ToolCall, state: State) -> Any:
        return answer

    rule = AskApproval(approve)
    with pytest.raises(TypeError, match=r"approval callback .*approve of AskApproval\(.*returned"):
        await rule.check(_call(), None, State())


# -- AskApproval on the terminal ----------------------------------------------------------------


@pytest.fixture
def prompts(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str | None]], list[str]]:
    """Answer terminal prompts from a list (None raises EOFError); return the prompts shown."""

    def install(answers: list[str | None]) -> list[str]:
        shown: list[str] = []

        def fake_input(prompt: str = "") -> str:
            shown.append(prompt)
            answer = answers.pop(0)
            if answer is None:
                raise EOFError
            return answer

        monkeypatch.setattr(builtins, "input", fake_input)
        return shown

    return install


@pytest.mark.parametrize(
    ("answer", "allowed"),
    [("y", True), ("yes", True), (" Y ", True), ("YES\n", True), ("", False), ("n", False),
     ("no", False), ("yeah", False), (None, False)],
)  # fmt: skip
async def test_terminal_prompt_answers(
    prompts: Callable[[list[str | None]], list[str]], answer: str | None, allowed: bool
) -> None:
    shown = prompts([answer])
    call = _call("write_file", path="ä.txt", lines=[1, 2])
    decision = await decide([AskApproval()], call, None, State())
    assert decision == (Allowed() if allowed else Denied("the user declined"), "AskApproval()")
    assert shown == ['Allow tool write_file({"path": "ä.txt", "lines": [1, 2]})? [y/N] ']


async def test_terminal_prompt_deny_stop(prompts: Callable[[list[str | None]], list[str]]) -> None:
    prompts(["n", None])
    rule = AskApproval(deny_stop=True)
    assert await rule.check(_call(), None, State()) == Denied("the user declined", stop=True)
    assert await rule.check(_call(), None, State()) == Denied("the user declined", stop=True)


async def test_concurrent_terminal_prompts_do_not_interleave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    guard = threading.Lock()
    active = 0
    most_active = 0
    shown: list[str] = []
    first_entered = anyio.Event()
    release_first = threading.Event()

    def fake_input(prompt: str = "") -> str:
        nonlocal active, most_active
        with guard:
            active += 1
            most_active = max(most_active, active)
            shown.append(prompt)
            first = len(shown) == 1
        if first:
            anyio.from_thread.run_sync(first_entered.set)
            release_first.wait(10)
        with guard:
            active -= 1
        return "y" if "one" in prompt else "n"

    monkeypatch.setattr(builtins, "input", fake_input)
    results: dict[str, tuple[Decision, str | None]] = {}

    async def run(rule: AskApproval, name: str) -> None:
        results[name] = await decide([rule], _call(name), None, State())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            # Two instances: the terminal is one, whichever rule asks.
            group.start_soon(run, AskApproval(), "one")
            group.start_soon(run, AskApproval(deny_stop=True), "two")
            await first_entered.wait()
            await anyio.wait_all_tasks_blocked()
            # The second prompt waits for the first: it is queued, not reading the terminal.
            assert len(shown) == 1
            assert terminal_lock().statistics().tasks_waiting == 1
            release_first.set()

    assert most_active == 1
    assert len(shown) == 2
    assert results == {
        "one": (Allowed(), "AskApproval()"),
        "two": (Denied("the user declined", stop=True), "AskApproval(deny_stop=True)"),
    }


async def test_a_cancelled_terminal_prompt_ends_at_once_and_frees_the_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered = anyio.Event()
    release = threading.Event()
    calls = 0

    def fake_input(prompt: str = "") -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            anyio.from_thread.run_sync(entered.set)
            release.wait(10)  # a user who never answers
            return "y"
        return "yes"

    monkeypatch.setattr(builtins, "input", fake_input)
    rule = AskApproval()
    finished = False

    async def ask() -> None:
        nonlocal finished
        await rule.check(_call(), None, State())
        finished = True

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(ask)
                await entered.wait()
                group.cancel_scope.cancel()
            assert not finished
            # The next prompt is not blocked by the abandoned one.
            assert await rule.check(_call(), None, State()) == Allowed()
    finally:
        release.set()
    assert calls == 2


# -- validation ---------------------------------------------------------------------------------


def test_check_permissions_accepts_none_and_ordered_collections() -> None:
    allow, deny = AllowByName("read_*"), DenyByName("rm")
    assert check_permissions(None) is None
    assert check_permissions([]) == ()
    assert check_permissions([allow, deny]) == (allow, deny)
    assert check_permissions((deny,)) == (deny,)
    assert check_permissions(rule for rule in [allow, deny]) == (allow, deny)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (AllowByName("x"), r"got a single AllowByName\(\['x'\]\): use permissions=\[AllowByName"),
        ("read_*", r"got the str 'read_\*': use permissions=\[AllowByName\('read_\*'\)\]"),
        (b"x", r"got the bytes"),
        ({AllowByReadOnly()}, r"got a set: the order of the rules matters, so use a list"),
        ({"x": AllowByReadOnly()}, r"got a dict: .*use a list"),
        (5, r"got int: e\.g\. permissions=\[DenyByName"),
        (["read_*"], r"permissions\[0\] is the str 'read_\*'.*AllowByName\('read_\*'\)"),
        ([AllowByReadOnly(), AllowByReadOnly], r"permissions\[1\] is the class AllowByReadOnly.*"),
        ([print], r"permissions\[0\] is print, a function.*subclass Permission"),
        ([None], r"permissions\[0\] is a NoneType, not a permission"),
    ],
)
def test_check_permissions_rejects_bad_values(value: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        check_permissions(value)


def test_check_permissions_rejects_a_sync_check_and_a_bad_name() -> None:
    class SyncCheck(Permission):
        def check(self, call: ToolCall, tool: Any | None, state: State) -> Any:
            return Allowed()

    class Nameless(Permission):
        name = ""

        async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
            return None

    with pytest.raises(TypeError, match=r"SyncCheck\.check must be `async def"):
        check_permissions([SyncCheck()])
    with pytest.raises(TypeError, match=r"permissions\[0\] \(Nameless\) has the name ''"):
        check_permissions([Nameless()])


@pytest.mark.parametrize("kind", [AllowByName, DenyByName])
@pytest.mark.parametrize(
    ("patterns", "error", "message"),
    [
        ([], ValueError, r"got no patterns"),
        ((), ValueError, r"got no patterns"),
        ([""], ValueError, r"empty pattern.*'\*'"),
        (["ok", 3], TypeError, r"patterns are str globs on tool names, got int 3"),
        (b"read", TypeError, r"takes a tool name pattern or a list of them, got bytes"),
        (5, TypeError, r"got int: use \w+\('read_\*'\)"),
        ({"read": 1}, TypeError, r"got dict"),
    ],
)
def test_patterns_are_checked(
    kind: type[AllowByName | DenyByName], patterns: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        kind(as_any(patterns))


def test_other_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match=r"Denied\.reason must be a str"):
        Denied(as_any(None))
    with pytest.raises(ValueError, match=r"Denied\.reason is empty"):
        Denied("  ")
    with pytest.raises(TypeError, match=r"Denied\.stop must be a bool"):
        Denied("no", stop=as_any(1))
    with pytest.raises(ValueError, match=r"Denied\.reason is empty"):
        DenyByName("x", reason="")
    with pytest.raises(TypeError, match=r"DenyByName\(stop=...\) must be a bool"):
        DenyByName("x", stop=as_any("yes"))
    with pytest.raises(TypeError, match=r"AskApproval\(callback\) takes a function"):
        AskApproval(as_any("y"))
    with pytest.raises(TypeError, match=r"AskApproval\(deny_stop=...\) must be a bool"):
        AskApproval(deny_stop=as_any(None))


# -- values, reprs, public module ---------------------------------------------------------------


def test_reprs_and_equality() -> None:
    def approve(call: ToolCall, state: State) -> bool:
        return True

    assert repr(AllowByName("read_*")) == "AllowByName(['read_*'])"
    assert repr(AllowByName(["a", "b"])) == "AllowByName(['a', 'b'])"
    assert repr(DenyByName("x")) == "DenyByName(['x'])"
    assert (
        repr(DenyByName("x", reason="r", stop=True)) == "DenyByName(['x'], reason='r', stop=True)"
    )
    assert repr(AllowByReadOnly()) == "AllowByReadOnly()"
    assert repr(AskApproval()) == "AskApproval()"
    assert repr(AskApproval(approve, deny_stop=True)) == (
        "AskApproval(test_reprs_and_equality.<locals>.approve, deny_stop=True)"
    )
    assert repr(Allowed()) == "Allowed()"
    assert repr(Denied("no")) == "Denied(reason='no', stop=False)"

    assert AllowByName("a") == AllowByName(["a"])
    assert AllowByName("a") != AllowByName("b")
    assert DenyByName("a", stop=True) != DenyByName("a")
    assert AllowByReadOnly() == AllowByReadOnly()
    assert AskApproval(approve) == AskApproval(approve)
    assert AskApproval(approve) != AskApproval()
    assert len({AllowByName("a"), AllowByName(["a"]), DenyByName("a"), DenyByName("a")}) == 2
    assert len({AskApproval(approve), AskApproval(approve), AskApproval()}) == 2
    assert AllowByName(("a", "b")).patterns == ("a", "b")
    rule = DenyByName("a", reason="r", stop=True)
    assert (rule.patterns, rule.reason, rule.stop) == (("a",), "r", True)
    asker = AskApproval(approve, deny_stop=True)
    assert (asker.callback, asker.deny_stop) == (approve, True)
    assert Allowed().kind == "allowed"
    assert Denied("x").kind == "denied"


def test_public_module_exports() -> None:
    module = orchestrator.permissions
    assert isinstance(module.__all__, tuple)
    assert sorted(module.__all__) == sorted(
        name for name in vars(module) if not name.startswith("_")
    )
    for name in module.__all__:
        assert getattr(module, name) is getattr(_permissions, name)
