"""Test doubles for agents: run them offline and deterministically.

`FakeModel` and `tool_call` script a model; `ReplayModel` answers from a saved run. To drive a
State through a turn by hand (what an Agent records for each turn: in a test, or to see what a
State does), `begin_think`, `record_reply` and `record_tool_result` record one entry each.
"""

from .._fake_model import FakeModel as FakeModel
from .._fake_model import FakeModelExhausted as FakeModelExhausted
from .._fake_model import tool_call as tool_call
from .._recording import begin_think as begin_think
from .._recording import record_reply as record_reply
from .._recording import record_tool_result as record_tool_result
from .._replay import ReplayMismatch as ReplayMismatch
from .._replay import ReplayModel as ReplayModel

__all__ = (
    "FakeModel",
    "FakeModelExhausted",
    "ReplayMismatch",
    "ReplayModel",
    "begin_think",
    "record_reply",
    "record_tool_result",
    "tool_call",
)
