"""The public surface: each package re-exports it with an explicit, sorted `__all__`."""

from __future__ import annotations

import importlib
import inspect
import types
from typing import Any

import pytest

import orchestrator
from orchestrator import Agent, Message, Usage
from orchestrator.testing import tool_call

# Every public module: the two packages and their public submodules.
PACKAGES = (
    "orchestrator",
    "orchestrator.mcp",
    "orchestrator.models",
    "orchestrator.otel",
    "orchestrator.permissions",
    "orchestrator.runners",
    "orchestrator.runners.contract",
    "orchestrator.testing",
    "stores",
    "stores.backend",
    "stores.contract",
)


def test_every_public_module_is_checked() -> None:
    """A public module (no ``_`` in its path) not listed above fails here: list it."""
    import pkgutil

    found = {"orchestrator", "stores"}
    for package in ("orchestrator", "stores"):
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                found.add(info.name)
    assert found == set(PACKAGES)


def _module(name: str) -> types.ModuleType:
    return importlib.import_module(name)


def _all(module: types.ModuleType) -> tuple[str, ...]:
    names: object = getattr(module, "__all__", None)
    assert isinstance(names, tuple), f"{module.__name__}.__all__ must be a tuple"
    for name in names:  # pyright: ignore[reportUnknownVariableType]
        assert isinstance(name, str), f"{module.__name__}.__all__ holds {name!r}"
    return tuple(str(name) for name in names)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_a_tuple_of_str(package: str) -> None:
    module = _module(package)
    assert isinstance(module.__dict__.get("__all__"), tuple)
    _all(module)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_sorted_without_duplicates(package: str) -> None:
    names = _all(_module(package))
    assert list(names) == sorted(names, key=_isort_key)  # the order ruff's RUF022 keeps
    assert len(set(names)) == len(names)


def _isort_key(name: str) -> tuple[int, str]:
    if name.isupper():
        return (0, name)
    return (1, name) if name[:1].isupper() else (2, name)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_exists(package: str) -> None:
    module = _module(package)
    missing = [name for name in _all(module) if not hasattr(module, name)]
    assert missing == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_attribute_is_in_all(package: str) -> None:
    """A package's public names are all exported; a module's, those it defines itself."""
    module = _module(package)
    names = set(_all(module))
    is_package = hasattr(module, "__path__")
    unlisted = [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name not in names
        and name != "annotations"
        and (
            is_package
            or (
                (inspect.isclass(value) or inspect.isfunction(value))
                and value.__module__ == package
            )
        )
    ]
    assert unlisted == [], f"public names of {package} missing from __all__: {unlisted}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_all_name_is_private(package: str) -> None:
    assert [name for name in _all(_module(package)) if name.startswith("_")] == []


@pytest.mark.parametrize("package", PACKAGES)
def test_exported_classes_and_functions_live_in_the_package(package: str) -> None:
    module = _module(package)
    wrong: list[str] = []
    for name in _all(module):
        value: object = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        home = str(getattr(value, "__module__", ""))
        top = package.split(".")[0]
        if home != top and not home.startswith(top + "."):
            wrong.append(f"{name} ({home})")
            continue
        # Defined in the package itself, or in a private module of it (orchestrator._messages),
        # or in a public submodule that re-exports it under the same name.
        parts = home.split(".")[1:]
        if parts and not any(part.startswith("_") for part in parts):
            submodule = importlib.import_module(home)
            if getattr(submodule, name, None) is not value:
                wrong.append(f"{name} ({home})")
    assert wrong == [], f"exported from {package} but defined elsewhere: {wrong}"


@pytest.mark.parametrize("package", PACKAGES)
def test_star_import_gives_exactly_all(package: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    imported = {name for name in namespace if name != "__builtins__"}
    assert imported == set(_all(_module(package)))


def test_orchestrator_exports_the_value_types() -> None:
    names = set(_all(_module("orchestrator")))
    expected = {
        "Message",
        "TextBlock",
        "Image",
        "ToolCall",
        "ToolResultBlock",
        "ReasoningBlock",
        "RawBlock",
        "Reply",
        "Usage",
        "FrozenDict",
        "FrozenList",
        "thaw",
        "State",
        "StateSnapshot",
        "StoppedByFinish",
        "StoppedByUntil",
        "StoppedByLimit",
        "StoppedByPermission",
        "OrchestratorError",
        "ToolError",
        "ValidationError",
        "merge_lists",
        "replace_values",
    }
    assert expected <= names


def test_the_public_api_has_the_design_names_and_signatures() -> None:
    # DESIGN 3 (explicit __all__), 4 (Message/blocks/Reply/Usage), 6 (Agent), 7 (ToolSpec,
    # ToolResult), 11 (FakeModel, tool_call(name, /, **args)).
    names = set(orchestrator.__all__)
    assert {
        "Agent",
        "ConsoleReporter",
        "Image",
        "Memory",
        "Message",
        "RawBlock",
        "ReasoningBlock",
        "Reply",
        "Reporter",
        "State",
        "StateSnapshot",
        "TextBlock",
        "Tool",
        "ToolCall",
        "ToolError",
        "ToolResult",
        "ToolResultBlock",
        "ToolSpec",
        "Usage",
        "loop",
        "tool",
        "waiting_for_user",
    } <= names

    def params(obj: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]

    empty = inspect.Parameter.empty
    keyword = inspect.Parameter.KEYWORD_ONLY
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert [(n, k) for n, k, _ in params(orchestrator.Reply)] == [
        ("message", positional),
        ("usage", positional),
        ("stop_reason", positional),
        ("model", positional),
    ]
    assert [n for n, _, _ in params(orchestrator.Usage)] == [
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "requests",
        "cost",
    ]
    assert Usage() == Usage(0, 0, 0, 0, 0, None)
    assert params(tool_call) == [
        ("name", inspect.Parameter.POSITIONAL_ONLY, empty),
        ("args", inspect.Parameter.VAR_KEYWORD, empty),
    ]
    assert tool_call("t", name="n").args == {"name": "n"}
    agent = params(Agent)
    assert agent[0][:2] == ("model", positional)
    assert [(n, k, d) for n, k, d in agent[1:]] == [
        (name, keyword, default)
        for name, default in [
            ("instructions", None),
            ("tools", ()),
            ("name", None),
            ("description", None),
            ("store", None),
            ("state_schema", None),
            ("collections", None),
            ("permissions", None),
            ("reporter", None),
            ("loop", None),
            ("max_concurrency", None),
            ("tool_timeout", None),
            ("max_turns", None),  # issue 12: the default loop's limit
            ("runner", None),  # issue 15: where the subagent tools' children run
            ("max_subagent_depth", None),  # issue 26: how deep subagents nest (10)
        ]
    ]
    assert [n for n, _, _ in params(orchestrator.ToolSpec)] == [
        "name",
        "description",
        "input_schema",
    ]
    assert [(n, d) for n, _, d in params(orchestrator.ToolResult)] == [
        ("message", None),
        ("state", None),
        ("is_error", False),
    ]
    for twin in ("run", "think", "use_tools", "ask", "compact"):
        assert inspect.iscoroutinefunction(getattr(Agent, "a" + twin))
        assert not inspect.iscoroutinefunction(getattr(Agent, twin))
    assert callable(orchestrator.Image.from_path)
    assert callable(orchestrator.Image.from_base64)
    assert Message.notice("x").text == "[notice] x"
    assert Message.notice("x").is_notice
