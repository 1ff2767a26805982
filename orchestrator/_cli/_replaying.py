"""`orchestrator replay`: run a saved tree again, offline, and say whether it matched.

The agents come from a factory the user names as ``module:function``. It is called with the
model to use, a `ReplayModel`, and returns the agents by name: ``{"lead": lead, ...}``; every
agent of the tree (subagents inside the lead's tools too) must ask that model. The root State's
agent is taken by the name its first run recorded.

Each run of the root is replayed from the recorded history just before it starts, so the input,
and what a person added between runs, are the recorded ones. The replay matched when every
request was a recorded one, every recorded request was asked, a run that failed failed with
the recorded error, and the root's messages at the end are the recorded messages.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from orchestrator import Agent, ErrorEntry, RunStartEntry, State
from orchestrator.testing import ReplayMismatch, ReplayModel

from ..testing._replay import agent_name, messages_difference

__all__ = ("FactoryError", "Replayed", "load_factory", "load_function", "pick_agent", "replay")

Factory = Callable[[ReplayModel], Mapping[str, Agent]]


class FactoryError(ValueError):
    """``--agents`` names no usable factory, or the factory returned no usable agents."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """How a replay went: whether it matched, and the first difference if not."""

    matched: bool
    difference: str | None
    requests: int
    states: int
    runs: int
    agent: str

    def data(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "matched": self.matched,
            "difference": self.difference,
            "requests": self.requests,
            "states": self.states,
            "runs": self.runs,
            "agent": self.agent,
        }


def load_factory(spec: str) -> Factory:
    """The agents factory ``module:name`` names, imported from the working folder too.

    Raises:
        FactoryError: `spec` is not ``module:name``, the module is not found, or it has no
            such callable.
    """
    found = load_function(spec, "a function that takes the model and returns the agents by name")
    return cast("Factory", found)


def load_function(spec: str, wanted: str) -> Callable[..., Any]:
    """The callable ``module:name`` names (`wanted` says what it should be, for errors).

    The module is imported from the working folder too.

    Raises:
        FactoryError: `spec` is not ``module:name``, the module is not found, or it has no
            such callable.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise FactoryError(
            f"--agents takes module:function, e.g. myapp.agents:build, got {spec!r}."
        )
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not module_name.startswith(error.name):
            raise  # the module itself imports something missing: its traceback says what
        raise FactoryError(
            f"--agents {spec}: no module {module_name!r} (searched the working folder and"
            " sys.path)."
        ) from None
    finally:
        if added:
            sys.path.remove(here)
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise FactoryError(f"--agents {spec}: module {module_name!r} has no {attribute!r}.")
        found = getattr(found, part)
    if not callable(found):
        raise FactoryError(
            f"--agents {spec}: {attribute!r} is a {type(found).__name__}, not {wanted}."
        )
    return cast("Callable[..., Any]", found)


def pick_agent(agents: object, root: State, chosen: str | None, spec: str) -> tuple[str, Agent]:
    """The agent that runs the root: `chosen`, else the one its first run recorded.

    Raises:
        FactoryError: The factory did not return agents by name, or not the one needed.
    """
    kind = type(agents).__name__
    items = cast("Mapping[object, object]", agents) if isinstance(agents, Mapping) else None
    if items is None or not all(
        isinstance(name, str) and isinstance(agent, Agent) for name, agent in items.items()
    ):
        raise FactoryError(
            f"The factory {spec} must return a dict of agent name -> Agent, got {kind}."
        )
    by_name = cast("Mapping[str, Agent]", items)
    recorded = agent_name(root)
    name = chosen or recorded
    if name is None:
        if len(by_name) == 1:
            name = next(iter(by_name))
        else:
            raise FactoryError(
                f"State {root.id} was run by an unnamed agent: pick one of the factory's with"
                f" --agent ({', '.join(sorted(by_name)) or 'it returned none'})."
            )
    if name not in by_name:
        raise FactoryError(
            f"The factory {spec} has no agent {name!r}"
            f"{' (the one that ran the State)' if chosen is None else ''}: it has"
            f" {', '.join(sorted(by_name)) or 'none'}."
        )
    return name, by_name[name]


def _error_text(error: BaseException) -> str:
    """An exception as history records it: ``"TypeName: message"``."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def replay(root: State, model: ReplayModel, agent: Agent, name: str) -> Replayed:
    """Run each run of `root` again with `agent` (whose tree asks `model`); compare.

    The root's runs are replayed one by one, each from the recorded history before it.

    Raises:
        ValueError: `root` never ran.
    """
    history = root.history
    starts = [entry.seq for entry in history if isinstance(entry, RunStartEntry)]
    bounds = [*starts[1:], len(history)]

    def result(difference: str | None) -> Replayed:
        return Replayed(
            matched=difference is None,
            difference=difference,
            requests=model.answered,
            states=len(model.state_ids),
            runs=len(starts),
            agent=name,
        )

    if not starts:
        raise ValueError(f"State {root.id} has no run to replay: no agent ran it.")
    live = State()
    for start, end in zip(starts, bounds, strict=True):
        live = State(history=history[:start])
        try:
            agent.run(live)
        except Exception as error:
            if model.mismatch is not None:
                return result(str(model.mismatch))
            recorded = {
                entry.content for entry in history[start:end] if isinstance(entry, ErrorEntry)
            }
            if _error_text(error) not in recorded:
                return result(
                    f"The replay raised {_error_text(error)!r}, which the recorded run did not."
                )
    try:
        model.check()
    except ReplayMismatch as mismatch:
        return result(str(mismatch))
    return result(_final_difference(root, live))


def _final_difference(root: State, live: State) -> str | None:
    """Where the root's messages after the replay differ from the recorded ones, if they do."""
    difference = messages_difference(root.messages, live.messages)
    if difference is None:
        return None
    return f"After the replay, the messages of State {root.id} differ: {difference}"
