"""The public surface: each package re-exports it with an explicit, sorted `__all__`."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from pathlib import Path
from typing import Any

import pytest

import orchestrator
from orchestrator import Agent, Message, Usage
from orchestrator.testing import tool_call

# Every public module: the two packages and their public submodules.
PACKAGES = (
    "orchestrator",
    "orchestrator.a2a",
    "orchestrator.apps",
    "orchestrator.apps.agui",
    "orchestrator.apps.vercel",
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


# The names a public module exports from the other package's private modules: their one public
# home is here, though the code that defines them lives there.
FOREIGN_HOMES = {"stores.backend": "orchestrator"}


@pytest.mark.parametrize("package", PACKAGES)
def test_exported_classes_and_functions_live_in_the_package(package: str) -> None:
    module = _module(package)
    wrong: list[str] = []
    for name in _all(module):
        value: object = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        home = str(getattr(value, "__module__", ""))
        tops = {package.split(".")[0], FOREIGN_HOMES.get(package, package.split(".")[0])}
        if not any(home == top or home.startswith(top + ".") for top in tops):
            wrong.append(f"{name} ({home})")
            continue
        # Defined in the package itself, or in a private module of it
        # (orchestrator._base._messages), or in a public submodule that re-exports it under the
        # same name.
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
        "Prompt",  # issue 30: what the model was told, recorded once per State
        "PromptEntry",
        "prompt_difference",
    }
    assert expected <= names


def test_orchestrator_exports_the_store_protocols() -> None:
    names = set(_all(_module("orchestrator")))
    assert {
        "Store",
        "AsyncStore",
        "BatchStore",
        "AsyncBatchStore",
        "Followable",
        "AsyncFollowable",
        "TreeFollowable",
        "AsyncTreeFollowable",
        "TreeEntry",
        "MemoryBackend",
        "AsyncMemoryBackend",
    } <= names
    assert [
        p.name for p in inspect.signature(orchestrator.BatchStore.save_many).parameters.values()
    ] == [
        "self",
        "states",
    ]
    assert inspect.iscoroutinefunction(orchestrator.AsyncBatchStore.asave_many)


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
        "reasoning_tokens",
    ]
    assert Usage() == Usage(0, 0, 0, 0, 0, None)
    assert inspect.signature(Usage).parameters["reasoning_tokens"].kind == keyword
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
            ("tool_errors", "raise"),  # issue 30: a tool's exception aborts, or goes to the model
            ("limits", None),  # issue 29: what a run tree may spend
        ]
    ]
    assert [n for n, _, _ in params(orchestrator.Prompt)] == [
        "instructions",
        "tools",
        "options",
        "digest",
    ]
    assert [n for n, _, _ in params(orchestrator.Prompt.of)] == ["instructions", "specs", "options"]
    # Issue 29: Limits, given to an Agent, a run, or an agent used as a tool.
    assert [(n, k, d) for n, k, d in params(orchestrator.Limits)] == [
        (name, keyword, None)
        for name in (
            "input_tokens",
            "output_tokens",
            "total_tokens",
            "cost",
            "requests",
            "tool_calls",
            "children",
            "depth",
            "seconds",
        )
    ]
    for method in ("run", "arun", "as_tool", "events"):
        assert ("limits", keyword, None) in params(getattr(Agent, method))
    assert [n for n, _, _ in params(orchestrator.StoppedByLimit)] == [
        "turns",
        "limit",
        "maximum",
        "spent",
        "owner",
        "by",
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


# Issue 27: what only a store backend needs moved from the root of `orchestrator` to
# `stores.backend`; the recording functions left `orchestrator.testing`. The old names work for
# one release and warn.
MOVED_TO_BACKEND = ("StorageView", "bind_state", "recover_state", "storage_view", "validate_id")
LEFT_TESTING = ("begin_think", "record_reply", "record_tool_result")


@pytest.mark.parametrize("name", MOVED_TO_BACKEND)
def test_backend_names_live_in_stores_backend_only(name: str) -> None:
    import stores.backend

    assert name in stores.backend.__all__
    assert name not in orchestrator.__all__
    assert name not in vars(orchestrator)  # given by __getattr__ only, so each use warns


@pytest.mark.parametrize("name", MOVED_TO_BACKEND)
def test_an_old_backend_name_warns_and_is_the_same_object(name: str) -> None:
    import stores.backend

    new = getattr(stores.backend, name)
    for _ in range(2):  # every use warns: the old name is never kept in the package
        with pytest.warns(DeprecationWarning, match=rf"from stores\.backend import {name}\b"):
            old: object = getattr(orchestrator, name)
        assert old is new


def test_from_orchestrator_import_an_old_name_warns() -> None:
    import stores.backend

    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=r"orchestrator\.bind_state is deprecated"):
        exec("from orchestrator import bind_state", namespace)
    assert namespace["bind_state"] is stores.backend.bind_state


@pytest.mark.parametrize("name", LEFT_TESTING)
def test_the_recording_functions_left_orchestrator_testing(name: str) -> None:
    import orchestrator._record._recording
    import orchestrator.testing

    assert name not in orchestrator.testing.__all__
    assert name not in vars(orchestrator.testing)
    with pytest.warns(DeprecationWarning, match="an Agent does for you"):
        old: object = getattr(orchestrator.testing, name)
    assert old is getattr(orchestrator._record._recording, name)


def test_an_unknown_name_still_raises_attribute_error() -> None:
    import orchestrator.testing

    with pytest.raises(AttributeError, match="has no attribute 'bind_sate'"):
        getattr(orchestrator, "bind_sate")  # noqa: B009
    with pytest.raises(AttributeError, match="has no attribute 'begin_thinking'"):
        getattr(orchestrator.testing, "begin_thinking")  # noqa: B009


ROOT = Path(__file__).resolve().parent.parent
_OLD = {"orchestrator": MOVED_TO_BACKEND, "orchestrator.testing": LEFT_TESTING}
_FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _old_uses(source: str, where: str) -> list[str]:
    """Each import or attribute use in `source` of a name under its old, deprecated path."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in _OLD:
            found += [
                f"{where}:{node.lineno}: from {node.module} import {alias.name}"
                for alias in node.names
                if alias.name in _OLD[node.module]
            ]
        elif isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            if node.attr in _OLD.get(owner, ()):
                found.append(f"{where}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_the_library_examples_docs_and_tests_use_the_new_homes() -> None:
    found: list[str] = []
    for folder in ("orchestrator", "stores", "examples", "tests", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "test_public_api.py":  # this module uses the old names on purpose
                found += _old_uses(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    for page in sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]):
        for index, block in enumerate(_FENCE.findall(page.read_text(encoding="utf-8"))):
            found += _old_uses(block, f"{page.relative_to(ROOT)} block {index}")
    assert found == []


def test_the_old_paths_check_finds_an_old_use() -> None:
    source = (
        "import orchestrator\n"
        "from orchestrator import State, bind_state\n"
        "from orchestrator.testing import FakeModel, record_reply\n"
        "orchestrator.storage_view\n"
        "orchestrator.testing.begin_think\n"
        "from stores.backend import bind_state\n"
    )
    assert _old_uses(source, "x") == [
        "x:2: from orchestrator import bind_state",
        "x:3: from orchestrator.testing import record_reply",
        "x:4: orchestrator.storage_view",
        "x:5: orchestrator.testing.begin_think",
    ]


# STYLE 23: a docstring says what and why for a user; a measurement (a time, a memory size, a
# share of a run) goes in the commit message that made the change.
_MEASUREMENT = re.compile(
    r"\d[\d,.]*\s?(?:µs|us|ms|MB|KB|kB|GB|%)(?![\w])|\bmeasured\b|\(medians?\)", re.IGNORECASE
)


def _measurements(source: str, where: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False) or ""
            found += [
                f"{where}:{getattr(node, 'lineno', 1)}: {line.strip()}"
                for line in text.splitlines()
                if _MEASUREMENT.search(line)
            ]
    return found


def test_docstrings_hold_no_measurements() -> None:
    found: list[str] = []
    for folder in ("orchestrator", "stores"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += _measurements(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == []


def test_the_measurement_check_finds_one() -> None:
    source = (
        '"""A module: a fresh process took 28 MB."""\n'
        "def f():\n"
        '    """Fast: 0.27 against 1.1 us (measured)."""\n'
        "def g():\n"
        '    """Waits 10 s at most, for 100% of the calls."""\n'
        "def h():\n"
        '    """Waits 10 s at most; a 3-turn run."""\n'
    )
    assert _measurements(source, "x") == [
        "x:1: A module: a fresh process took 28 MB.",
        "x:2: Fast: 0.27 against 1.1 us (measured).",
        "x:4: Waits 10 s at most, for 100% of the calls.",
    ]


def test_rate_limits_and_fallback_have_their_names_and_signatures() -> None:
    # Issue 29 items 3 and 4: rate limits shared through a store, and models tried in order.
    import orchestrator.models
    import stores.backend

    assert {"FallbackModel", "RateLimit", "RateLimited"} <= set(orchestrator.models.__all__)
    assert "RateLimitWaited" in orchestrator.__all__
    assert {"AsyncRateLimits", "RateAsk", "RateTimes", "next_times"} <= set(stores.backend.__all__)
    keyword = inspect.Parameter.KEYWORD_ONLY
    assert [
        (p.name, p.kind, p.default)
        for p in inspect.signature(orchestrator.models.RateLimit).parameters.values()
    ] == [
        ("requests_per_minute", keyword, None),
        ("tokens_per_minute", keyword, None),
        ("concurrent", keyword, None),
        ("burst", keyword, 1),
        ("store", keyword, None),
        ("key", keyword, None),
        ("lease", keyword, 30.0),
    ]
    for provider in ("OpenAIModel", "AnthropicModel"):
        signature = inspect.signature(getattr(orchestrator.models, provider))
        assert signature.parameters["rate_limit"].default is None
    assert list(inspect.signature(orchestrator.models.FallbackModel).parameters) == ["models"]
    assert list(inspect.signature(orchestrator.models.RateLimited).parameters) == [
        "model",
        "limit",
        "backoff",
    ]
