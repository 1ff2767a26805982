"""Test doubles for agents: run them offline and deterministically.

`FakeModel` and `tool_call` script a model; `ReplayModel` answers from a saved run.
"""

import typing as _typing

from .._base._lazy import lazy_names as _lazy_names
from ._fake_model import FakeModel as FakeModel
from ._fake_model import FakeModelExhausted as FakeModelExhausted
from ._fake_model import tool_call as tool_call
from ._replay import ReplayMismatch as ReplayMismatch
from ._replay import ReplayModel as ReplayModel

# The recording functions an Agent's loop uses were exported here to play a turn by hand; they
# are the library's own steps, not test doubles. They keep working (and warn) for one release.
_RECORDING = (
    "it records one step of a turn, which an Agent does for you: run the turn with an Agent"
    " and a FakeModel (agent.think, agent.use_tools), or build the State from its history"
    " entries with State(history=[...])"
)
_MOVED: dict[str, tuple[str, str]] = dict.fromkeys(
    ("begin_think", "record_reply", "record_tool_result"),
    ("orchestrator._record._recording", _RECORDING),
)

__getattr__: _typing.Callable[[str], _typing.Any] = _lazy_names(__name__, {}, _MOVED)

__all__ = (
    "FakeModel",
    "FakeModelExhausted",
    "ReplayMismatch",
    "ReplayModel",
    "tool_call",
)
